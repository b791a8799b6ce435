"""The embedding engine on a tiny random BERT: batching invariance, the token budget, truncation, priority,
abort, and bad input refused at add_request."""

import random
from pathlib import Path

import pytest
import torch

from contract.engine import EngineConfig
from contract.pooling import EmbeddingParams
from contract.sampling import ContractError
from tests.support.tiny_models import CORPUS, make_tiny_bert
from worker.engine import LLM
from worker.engine.embedding_engine import EmbeddingEngine
from worker.engine.outputs import EmbeddingOutput

pytestmark = pytest.mark.fast

MAX_SEQ_LENGTH = 48


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), "mean", True, MAX_SEQ_LENGTH)


def engine(path: Path, **config: object) -> EmbeddingEngine:
    return EmbeddingEngine(EngineConfig(model=str(path), device="cpu", **config))  # type: ignore[arg-type]


def run(engine: EmbeddingEngine) -> list[list[EmbeddingOutput]]:
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    return steps


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(CORPUS[:5]).split()
    return [" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(count)]


def test_an_inputs_vector_does_not_depend_on_its_batch(tiny_bert: Path) -> None:
    llm = LLM(str(tiny_bert), kind="embed", device="cpu")
    inputs = texts(60)
    together = llm.embed(inputs)  # one step: every length at once, equal lengths sharing attention calls
    alone = [llm.embed(text)[0] for text in inputs[:12]]
    shuffled = dict(zip(inputs[30:], llm.embed(inputs[30:][::-1])[::-1], strict=True))
    for i, output in enumerate(alone):
        assert output.embedding == together[i].embedding, i  # bit for bit
    for text, output in zip(inputs[30:], together[30:], strict=True):
        assert shuffled[text].embedding == output.embedding


def test_steps_keep_to_the_token_budget_and_seats(tiny_bert: Path) -> None:
    eng = engine(tiny_bert, max_num_batched_tokens=64, max_num_seqs=5)
    ids = [eng.encode([text])[0] for text in texts(30, seed=1)]
    for i, token_ids in enumerate(ids):
        eng.add_request(str(i), token_ids)
    steps = run(eng)
    assert sorted(int(o.request_id) for step in steps for o in step) == list(range(30))
    for step in steps:
        assert len(step) <= 5
        assert len(step) == 1 or sum(o.num_tokens for o in step) <= 64
    assert eng.stats().num_embedded_tokens == sum(map(len, ids))


def test_a_step_runs_the_first_waiting_input_even_past_the_budget(tiny_bert: Path) -> None:
    eng = engine(tiny_bert, max_num_batched_tokens=8)
    eng.add_request("long", "fox " * 30)
    eng.add_request("short", "fox")
    steps = run(eng)
    assert [[o.request_id for o in step] for step in steps] == [["long"], ["short"]]
    assert steps[0][0].num_tokens == 32


def test_priority_then_arrival_order(tiny_bert: Path) -> None:
    eng = engine(tiny_bert, max_num_seqs=1)
    for request_id, priority in [("a", 5), ("b", 0), ("c", 5), ("d", -1)]:
        eng.add_request(request_id, "the quick brown fox", priority=priority)
    assert [step[0].request_id for step in run(eng)] == ["d", "b", "a", "c"]


def test_inputs_are_truncated_to_max_seq_length_or_truncate_prompt_tokens(tiny_bert: Path) -> None:
    eng = engine(tiny_bert)
    long_text = " ".join(CORPUS[:5])
    full = eng.encode([long_text])[0]
    assert len(full) == MAX_SEQ_LENGTH and full[0] == eng.tokenizer.cls_token_id
    assert full[-1] == eng.tokenizer.sep_token_id  # cut as sentence-transformers cuts: [SEP] kept
    eng.add_request("text", long_text)
    eng.add_request("ids", full + full)  # token ids are cut too, to the first max_seq_length
    eng.add_request("short", long_text, EmbeddingParams(truncate_prompt_tokens=10))
    eng.add_request("one", long_text, EmbeddingParams(truncate_prompt_tokens=1))
    outputs = {o.request_id: o for step in run(eng) for o in step}
    assert outputs["text"].num_tokens == outputs["ids"].num_tokens == MAX_SEQ_LENGTH
    assert outputs["text"].embedding == outputs["ids"].embedding
    assert (outputs["short"].num_tokens, outputs["one"].num_tokens) == (10, 1)
    assert outputs["short"].embedding != outputs["text"].embedding


def test_dimensions_are_refused_by_a_model_without_them(tiny_bert: Path) -> None:
    eng = engine(tiny_bert)
    eng.add_request("full", "fox", EmbeddingParams(dimensions=64))  # its own size is fine
    with pytest.raises(ContractError, match="dimensions"):
        eng.add_request("short", "fox", EmbeddingParams(dimensions=16))
    assert len(run(eng)[0][0].embedding) == 64


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ("", None, "empty"),
        ([], None, "empty"),
        ([0, 10**6], None, r"token ids must be integers in \[0, "),
        ([-1], None, "token ids"),
        ("fox", EmbeddingParams(truncate_prompt_tokens=MAX_SEQ_LENGTH + 1), "truncate_prompt_tokens"),
        ("fox", EmbeddingParams(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    ],
)
def test_bad_input_is_refused_at_add_request(
    tiny_bert: Path, prompt: object, params: object, match: str
) -> None:
    eng = engine(tiny_bert)
    with pytest.raises(ValueError, match=match):
        eng.add_request("r", prompt, params)  # type: ignore[arg-type]
    assert not eng.has_unfinished_requests()


def test_duplicate_ids_and_aborts(tiny_bert: Path) -> None:
    eng = engine(tiny_bert)
    eng.add_request("a", "fox")
    eng.add_request("b", "dog")
    with pytest.raises(ValueError, match="already exists"):
        eng.add_request("a", "cat")
    assert eng.abort("a") and not eng.abort("a")
    outputs = {o.request_id: o for step in run(eng) for o in step}
    assert (outputs["a"].error, outputs["a"].embedding) == ("aborted", [])
    assert outputs["b"].error is None and len(outputs["b"].embedding) == 64


def test_library_refuses_the_other_kind(tiny_bert: Path, tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match="does not generate"):
        LLM(str(tiny_bert), kind="embed", device="cpu").generate("fox")
    with pytest.raises(ValueError, match="does not embed"):
        LLM(str(tiny_llama), device="cpu").embed("fox")
    with pytest.raises(ValueError, match="kind must be one of"):
        LLM(str(tiny_bert), kind="rerank")
    with pytest.raises(ValueError, match="no inputs"):
        LLM(str(tiny_bert), kind="embed", device="cpu").embed([])


def test_vectors_are_unit_length_and_float32(tiny_bert: Path) -> None:
    outputs = LLM(str(tiny_bert), kind="embed", device="cpu").embed(texts(5))
    norms = torch.tensor([o.embedding for o in outputs]).norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(5))


def test_one_bad_input_refuses_the_call_and_leaves_nothing_queued(tiny_bert: Path) -> None:
    llm = LLM(str(tiny_bert), kind="embed", device="cpu")
    with pytest.raises(ValueError, match="token ids"):
        llm.embed(["the quick brown fox", [5, 10**6], "dog"])
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="input 1 is empty"):
        llm.embed(["fox", ""])
    [output] = llm.embed(["the quick brown fox"])
    assert output.error is None and len(output.embedding) == 64
