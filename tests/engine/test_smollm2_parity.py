"""The default model, SmolLM2-135M-Instruct: the engine's greedy output equals transformers'."""

from pathlib import Path

import pytest

from tests.support.reference import HFReference, assert_pool_empty, chosen_logprobs, hf_beam_search
from worker.engine import LLM, SamplingParams
from worker.engine.default_model import ensure_default_model

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "hi",
    "Summarise: The mitochondria is the powerhouse of the cell. It produces ATP through respiration, "
    "and it has its own DNA, which suggests it was once a free-living bacterium.",
    "What is 12 times 12?",
    "Give me a name for a pet turtle.",
    "Why is the sky blue? Answer briefly.",
    "Write a Python function that reverses a string.",
    "Who wrote Romeo and Juliet?",
    "Describe the taste of coffee to someone who has never had it, in one paragraph, using vivid "
    "comparisons to other foods and drinks that most people know, such as chocolate, tea or toast.",
    "Is a tomato a fruit or a vegetable?",
    "Count from one to five.",
    "What does CPU stand for?",
]
MAX_NEW = 32

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path() -> Path:
    return ensure_default_model()


def test_smollm2_greedy_matches_transformers(model_path: Path) -> None:
    llm = LLM(str(model_path), max_num_batched_tokens=512)
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    outputs = llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=0))
    reference = HFReference(model_path)
    for conversation, out in zip(conversations, outputs, strict=True):
        want_tokens, want_logprobs = reference.greedy(
            llm.chat_prompt(conversation), MAX_NEW, stop_at_eos=True
        )
        got = out.outputs[0]
        assert got.token_ids == want_tokens, conversation[0]["content"]
        assert chosen_logprobs(got) == pytest.approx(want_logprobs, abs=2e-3)
        assert got.finish_reason == ("stop" if len(want_tokens) < MAX_NEW else "length")
    assert_pool_empty(llm)


def test_smollm2_beam_search_matches_transformers(model_path: Path) -> None:
    llm = LLM(str(model_path), max_num_batched_tokens=512)
    model = HFReference(model_path).model
    params = SamplingParams(use_beam_search=True, n=4, temperature=0.0, max_tokens=16)
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS[:6]]
    outputs = llm.chat(conversations, params)
    for conversation, out in zip(conversations, outputs, strict=True):
        want = hf_beam_search(model, llm.chat_prompt(conversation), 4, 16, llm.engine.eos_token_ids)
        assert [sample.token_ids for sample in out.outputs] == want, conversation[0]["content"]
    assert_pool_empty(llm)
