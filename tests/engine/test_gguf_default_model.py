"""The default model served from its own Q4_1 GGUF file (``quantization="gguf"``) against the float32
engine on the same weights de-quantized (the default path's ``model.safetensors`` is that file
de-quantized by transformers): the issue's fidelity bar on 24 chat prompts x 48 greedy tokens, at
least 18 sharing their first 16 tokens and a mean common prefix of at least 32."""

import pytest

from tests.engine.test_smollm2_parity import QUESTIONS
from worker.engine import LLM, SamplingParams
from worker.engine.default_model import DEFAULT_MODEL
from worker.engine.model.gguf_loader import weight_types

pytestmark = pytest.mark.slow

PROMPTS = [
    *QUESTIONS,
    "Name a colour of the rainbow.",
    "What is the boiling point of water in Celsius?",
    "Suggest a title for a short story about a lighthouse keeper.",
    "How many legs does a spider have?",
    "Write one sentence about autumn.",
    "What is the opposite of 'ancient'?",
    "Give an example of a mammal that can fly.",
    "What language is spoken in Brazil?",
][:24]
MAX_NEW = 48


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_default_model_gguf_keeps_q4_1_and_follows_float32() -> None:
    quantized = LLM(DEFAULT_MODEL, quantization="gguf", max_num_batched_tokens=1024)
    model = quantized.engine.runner.model
    assert set(weight_types(model)) <= {"Q4_1", "Q8_0", "Q6_K", "F16", "F32"}
    assert "Q4_1" in weight_types(model)
    dense = LLM(DEFAULT_MODEL, max_num_batched_tokens=1024)
    conversations = [[{"role": "user", "content": p}] for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in quantized.chat(conversations, params)]
    want = [o.outputs[0].token_ids for o in dense.chat(conversations, params)]
    prefixes = [common_prefix(a, b) for a, b in zip(got, want, strict=True)]
    assert sum(p >= 16 for p in prefixes) >= 18, prefixes
    assert sum(prefixes) / len(prefixes) >= 32, prefixes
