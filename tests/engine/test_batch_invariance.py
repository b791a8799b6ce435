"""Batch invariance: a request's logits and tokens (greedy and seeded) are the same bits alone, batched with
others of other lengths, chunked, preempted and recomputed, after a prefix-cache hit, or with one seat."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.engine.test_engine_behaviour import drain
from worker.engine import LLM, LLMEngine, SamplingParams
from worker.engine.scheduler import ScheduledBatch
from worker.engine.sequence import Sequence

pytestmark = pytest.mark.fast

PROMPT = list(range(3, 43))  # 40 tokens: two full blocks and a partial one
TARGETS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    "seeded": SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, ignore_eos=True, seed=7),
}
Logits = dict[tuple[str, int], torch.Tensor]  # (request, position sampled) -> its logits row


def record_logits(engine: LLMEngine) -> Logits:
    """Every logits row the engine computes from now on, keyed by request and position."""
    seen: Logits = {}
    execute: Callable[[ScheduledBatch], torch.Tensor] = engine.runner.execute

    def recording(batch: ScheduledBatch) -> torch.Tensor:
        logits = execute(batch)
        pairs = zip(batch.sequences, batch.num_new_tokens, strict=True)
        due = [seq for seq, n in pairs if seq.num_computed_tokens + n == seq.num_tokens]
        for seq, row in zip(due, logits, strict=True):
            seen[(seq.request.request_id, seq.num_tokens)] = row.clone()
        return logits

    engine.runner.execute = recording  # type: ignore[method-assign]
    return seen


def record_preemptions(engine: LLMEngine) -> list[str]:
    """The request ids of the sequences the scheduler preempts from now on."""
    preempted: list[str] = []
    preempt = engine.scheduler._preempt

    def recording(seq: Sequence) -> None:
        preempted.append(seq.request.request_id)
        preempt(seq)

    engine.scheduler._preempt = recording  # type: ignore[method-assign]
    return preempted


def others(count: int) -> Iterator[tuple[list[int], SamplingParams]]:
    """Requests of other lengths and parameters to share the target's steps."""
    for i in range(count):
        prompt = [(7 * i + j) % 300 + 3 for j in range(5 + 13 * i)]
        temperature = 0.8 if i % 2 else 0.0
        yield prompt, SamplingParams(temperature=temperature, max_tokens=10 + 5 * i, ignore_eos=True)


def run(
    llm: LLM, before: int = 0, beside: int = 0, priority: int = 0
) -> tuple[dict[str, list[int]], Logits, LLMEngine]:
    """The targets' token ids and logits: after ``before`` requests sharing their prompt's first block
    (then the targets' prompts hit the prefix cache), and among ``beside`` other requests."""
    engine = llm.engine
    for i in range(before):
        engine.add_request(f"warm{i}", [*PROMPT[:20], 299 - i], SamplingParams(temperature=0.0, max_tokens=2))
    drain(engine)
    logits = record_logits(engine)
    for name, params in TARGETS.items():
        engine.add_request(name, PROMPT, params, priority)
    for i, (prompt, params) in enumerate(others(beside)):
        engine.add_request(f"other{i}", prompt, params)
    outputs = drain(engine)
    assert all(outputs[name].num_cached_tokens > 0 for name in TARGETS) if before else True
    return {name: outputs[name].outputs[0].token_ids for name in TARGETS}, logits, engine


@pytest.fixture(scope="module")
def alone(tiny_llama: Path) -> tuple[dict[str, list[int]], Logits]:
    tokens, logits, _ = run(LLM(str(tiny_llama), kv_cache_bytes=4 << 20, max_num_seqs=2, block_size=16))
    return tokens, logits


def assert_same(alone: tuple[dict[str, list[int]], Logits], tokens: dict, logits: Logits) -> None:
    assert tokens == alone[0]
    for name in TARGETS:
        for position in range(len(PROMPT), len(PROMPT) + 24):
            key = (name, position)
            assert torch.equal(logits[key], alone[1][key]), f"{name}: the logits at {position} differ"


@pytest.mark.parametrize(
    ("engine_args", "before", "beside"),
    [
        ({}, 0, 6),  # batched with others of other lengths
        ({"max_num_batched_tokens": 7}, 0, 3),  # prefills chunked at other boundaries, decodes beside
        ({"max_num_seqs": 1}, 0, 2),  # one seat: every request alone in its steps, in turn
        ({}, 2, 4),  # the prompt's first block from the prefix cache
    ],
    ids=["batched", "chunked", "one-seat", "prefix-hit"],
)
def test_a_request_is_the_same_whatever_shares_its_steps(
    tiny_llama: Path, alone: tuple, engine_args: dict, before: int, beside: int
) -> None:
    llm = LLM(str(tiny_llama), **{"kv_cache_bytes": 4 << 20, "block_size": 16, **engine_args})
    tokens, logits, engine = run(llm, before, beside)
    assert engine.runner.batch_invariant
    assert_same(alone, tokens, logits)


def test_a_request_is_the_same_when_its_chunks_shrink_with_their_context(
    tiny_llama: Path, alone: tuple
) -> None:
    """The CPU scheduler sizes a prefill chunk by its context (Scheduler.context_keys): here a token after
    8 keys counts twice, so the prompt goes in ever smaller chunks (1 to 24 tokens), decodes beside."""
    llm = LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16, max_num_batched_tokens=24)
    llm.engine.scheduler.context_keys = 8
    tokens, logits, _ = run(llm, 0, 3)
    assert_same(alone, tokens, logits)


@pytest.mark.parametrize("kernel", ["float", "int8"])
def test_a_gguf_request_is_the_same_whatever_shares_its_steps(tmp_path: Path, kernel: str) -> None:
    from tests.engine.test_gguf_engine import tiny_gguf

    path = str(tiny_gguf(tmp_path))
    args = {"kv_cache_bytes": 4 << 20, "block_size": 16, "quantization": "gguf", "gguf_kernel": kernel}
    tokens, logits, _ = run(LLM(path, **args, max_num_seqs=2))
    batched_tokens, batched_logits, engine = run(LLM(path, **args), 0, 6)
    assert engine.runner.batch_invariant
    assert_same((tokens, logits), batched_tokens, batched_logits)


def test_preempted_and_recomputed_request_is_the_same(tiny_llama: Path, alone: tuple) -> None:
    """A KV pool of 12 blocks for requests that need up to 5 each: the targets, of a lower priority, are
    preempted and their tokens recomputed in a prefill, whose logits must equal the decode steps' of the
    run alone."""
    llm = LLM(str(tiny_llama), block_size=16)
    per_block = llm.engine.runner.kv_cache_bytes // llm.engine.runner.num_blocks
    llm = LLM(str(tiny_llama), block_size=16, kv_cache_bytes=12 * per_block)
    preempted = record_preemptions(llm.engine)
    tokens, logits, _ = run(llm, 0, 5, priority=1)
    assert set(TARGETS) & set(preempted), preempted
    assert_same(alone, tokens, logits)


def test_an_unseeded_request_reports_the_seed_that_replays_it(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16)
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    first, second = llm.generate([PROMPT, PROMPT], params)
    assert params.seed is None and first.seed is not None and first.seed != second.seed
    [replay] = llm.generate(
        PROMPT, SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=first.seed)
    )
    assert replay.seed == first.seed and replay.outputs[0].token_ids == first.outputs[0].token_ids


@pytest.mark.slow
def test_the_default_model_is_the_same_alone_and_in_a_busy_engine() -> None:
    """SmolLM2-135M, whose 1536-wide down projection is where oneDNN's blocking changes with the row count:
    alone with one seat, then batched, chunked 32 tokens a step and preempted (a 10-block pool)."""
    alone = LLM(max_num_seqs=1, kv_cache_bytes=64 << 20)
    tokens, logits, _ = run(alone)
    per_block = alone.engine.runner.kv_cache_bytes // alone.engine.runner.num_blocks
    busy = LLM(kv_cache_bytes=10 * per_block, max_num_batched_tokens=32)
    preempted = record_preemptions(busy.engine)
    crowd_tokens, crowd_logits, _ = run(busy, 0, 5, priority=1)
    assert set(TARGETS) & set(preempted), preempted
    assert_same((tokens, logits), crowd_tokens, crowd_logits)
