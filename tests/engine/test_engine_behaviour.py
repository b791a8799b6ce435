"""What callers rely on: sampling controls, stops, n > 1, abort, priorities, incremental steps."""

import gc
from pathlib import Path

import pytest

from tests.support.reference import assert_pool_empty
from worker.engine import LLM, LLMEngine, RequestOutput, SamplingParams

pytestmark = pytest.mark.fast

PROMPT = "Paged attention stores keys and values in"


@pytest.fixture(scope="module")
def llm(tiny_llama: Path) -> LLM:
    return LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16)


@pytest.fixture
def engine(llm: LLM) -> LLMEngine:
    yield llm.engine
    assert not llm.engine.has_unfinished_requests()
    assert_pool_empty(llm)


def drain(engine: LLMEngine, first: list[RequestOutput] = ()) -> dict[str, RequestOutput]:
    """Run the engine dry, folding every step's deltas (and ``first``) into whole outputs."""
    results: dict[str, RequestOutput] = {}
    pending = list(first)
    while pending or engine.has_unfinished_requests():
        for delta in pending or engine.step():
            if delta.request_id in results:
                results[delta.request_id].extend(delta)
            else:
                results[delta.request_id] = delta
        pending = []
    return results


def test_seeded_sampling_is_reproducible_and_batch_independent(llm: LLM, engine: LLMEngine) -> None:
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=7, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    alone = llm.generate(PROMPT, seeded)[0].outputs[0].token_ids
    again = llm.generate(PROMPT, seeded)[0].outputs[0].token_ids
    crowd = llm.generate(["Hello there", PROMPT, "The quick brown fox"], [other, seeded, other])
    assert alone == again == crowd[1].outputs[0].token_ids
    reseeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=8, ignore_eos=True)
    assert llm.generate(PROMPT, reseeded)[0].outputs[0].token_ids != alone


def test_stop_string_cuts_the_text(llm: LLM, engine: LLMEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    full = llm.generate(PROMPT, greedy)[0].outputs[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    cut = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop]))
    sample = cut[0].outputs[0]
    assert sample.text == full[: full.index(stop)]
    assert (sample.finish_reason, sample.stop_reason) == ("stop", stop)
    kept = SamplingParams(
        temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
    )
    assert llm.generate(PROMPT, kept)[0].outputs[0].text == full[: full.index(stop) + len(stop)]


def test_stop_token_id_ends_the_sample(llm: LLM, engine: LLMEngine) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    tokens = llm.generate(PROMPT, greedy)[0].outputs[0].token_ids
    stop_id = tokens[6]
    first = tokens.index(stop_id)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop_id])
    sample = llm.generate(PROMPT, params)[0].outputs[0]
    assert sample.token_ids == tokens[: first + 1]
    assert (sample.finish_reason, sample.stop_reason) == ("stop", stop_id)


def test_min_tokens_forbids_an_early_stop(llm: LLM, engine: LLMEngine) -> None:
    tokens = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    stop_id = tokens[0].outputs[0].token_ids[0]
    params = SamplingParams(temperature=0.0, max_tokens=30, min_tokens=5, stop_token_ids=[stop_id])
    sample = llm.generate(PROMPT, params)[0].outputs[0]
    assert len(sample.token_ids) >= 5
    assert stop_id not in sample.token_ids[:5]


def test_n_samples_share_the_prompt_blocks(llm: LLM, engine: LLMEngine) -> None:
    prompt = llm.tokenizer.encode(PROMPT * 6)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=8, seed=3, ignore_eos=True)
    engine.add_request("fan-out", prompt, params)
    first = engine.step()  # the whole prompt is computed, then forked
    seqs, bm = engine.requests["fan-out"].sequences, engine.scheduler.block_manager
    assert len(seqs) == 4
    full_blocks = len(prompt) // 16
    assert all(s.block_table[:full_blocks] == seqs[0].block_table[:full_blocks] for s in seqs)
    assert all(bm.blocks[b].ref_count == 4 for b in seqs[0].block_table[:full_blocks])
    assert bm.num_blocks - bm.num_free_blocks < 2 * len(seqs[0].block_table)
    out = drain(engine, first)["fan-out"]
    assert [o.index for o in out.outputs] == [0, 1, 2, 3]
    assert all(len(o.token_ids) == 8 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_abort_frees_blocks_at_once_and_keeps_partial_output(engine: LLMEngine) -> None:
    # ignore_eos: sampled from random weights, it once drew EOS in its first three steps and ended unaborted
    doomed_params = SamplingParams(max_tokens=50, ignore_eos=True)
    engine.add_request("doomed", "Continuous batching refills a slot", doomed_params)
    engine.add_request("survivor", "The quick brown fox", SamplingParams(temperature=0.0, max_tokens=5))
    first = [delta for _ in range(3) for delta in engine.step()]
    doomed, bm = engine.requests["doomed"].sequences[0], engine.scheduler.block_manager
    blocks_in_use = bm.num_blocks - bm.num_free_blocks
    assert engine.abort("doomed")
    assert not engine.abort("doomed")
    assert doomed.block_table == [] and doomed not in engine.scheduler.running
    assert bm.num_blocks - bm.num_free_blocks < blocks_in_use
    results = drain(engine, first)
    assert results["doomed"].finished and results["doomed"].outputs[0].finish_reason == "abort"
    assert len(results["doomed"].outputs[0].token_ids) == 3
    assert results["survivor"].outputs[0].finish_reason == "length"


def test_request_that_can_never_fit_fails_at_once(engine: LLMEngine) -> None:
    with pytest.raises(ValueError, match="exceeds the model's context of 1024 tokens"):
        engine.add_request("too-long", [5] * 1000, SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=0)


def test_lower_priority_value_is_served_first(tiny_llama: Path) -> None:
    engine = LLM(str(tiny_llama), kv_cache_bytes=4 << 20, max_num_seqs=1).engine
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for request_id, priority in [("late-low", 5), ("urgent", 0), ("normal-a", 1), ("normal-b", 1)]:
        engine.add_request(request_id, "Hello there", params, priority=priority)
    finished = [out.request_id for _ in range(40) for out in engine.step() if out.finished]
    assert finished == ["urgent", "normal-a", "normal-b", "late-low"]


def test_steps_are_incremental_and_add_up_to_generate(llm: LLM, engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)
    [whole] = llm.generate(PROMPT, params)
    engine.add_request("stream", PROMPT, params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    assert "".join(d.outputs[0].text for d in deltas) == whole.outputs[0].text
    assert [t for d in deltas for t in d.outputs[0].token_ids] == whole.outputs[0].token_ids
    # each step carries the times of its own new tokens only, and folding them gives the whole list
    assert all(len(d.metrics.token_times) == len(d.outputs[0].token_ids) for d in deltas)
    times = [t for d in deltas for t in d.metrics.token_times]
    assert len(times) == len(whole.metrics.token_times) == 25 and times == sorted(times)
    last = deltas[-1].metrics
    assert last.arrival_time <= last.first_scheduled_time <= last.first_token_time == times[0]
    assert times[-1] <= last.finished_time


def test_greedy_samples_that_copy_on_write_match_a_single_sample(llm: LLM, engine: LLMEngine) -> None:
    prompt = llm.tokenizer.encode(PROMPT * 3)
    assert len(prompt) % 16, "the last prompt block must be partial, so samples copy it on write"
    single = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    fanned = llm.generate(prompt, SamplingParams(n=3, temperature=0.0, max_tokens=20, ignore_eos=True))
    assert [o.token_ids for o in fanned[0].outputs] == [single[0].outputs[0].token_ids] * 3


def test_logprobs_and_their_sum_only_when_asked_for(llm: LLM, engine: LLMEngine) -> None:
    asked = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, logprobs=2)
    plain = SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True)
    with_lp, without = (out.outputs[0] for out in llm.generate([PROMPT, PROMPT], [asked, plain]))
    assert with_lp.token_ids == without.token_ids  # same seed: logprobs do not change the draw
    assert without.logprobs is None and without.cumulative_logprob is None
    chosen = [step[token] for step, token in zip(with_lp.logprobs, with_lp.token_ids, strict=True)]
    assert all(lp < 0 for lp in chosen)
    assert with_lp.cumulative_logprob == pytest.approx(sum(chosen), abs=1e-4)
    assert all(len(step) in (2, 3) for step in with_lp.logprobs)  # the top 2, plus the token if outside them


def test_engine_time_splits_each_step_over_its_requests_by_tokens(engine: LLMEngine) -> None:
    busy_before = engine.stats().busy_time
    long_prompt = " ".join(["Paged attention stores keys and values in blocks."] * 12)
    engine.add_request("long", long_prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.add_request("short", "Hello", SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    engine.add_request("fan", "The quick brown fox", SamplingParams(n=2, max_tokens=6, ignore_eos=True))
    engine.add_request("doomed", "Continuous batching", SamplingParams(max_tokens=50))
    first = engine.step()
    engine.abort("doomed")
    results = drain(engine, first)
    spent = {request_id: out.metrics.engine_time for request_id, out in results.items()}
    busy = engine.stats().busy_time - busy_before
    assert busy > 0 and sum(spent.values()) == pytest.approx(busy, rel=1e-9)
    # the first step computed every prompt: the long one (~120 tokens) was charged most of it
    assert spent["long"] > spent["short"] and spent["doomed"] > 0


def freeze_counts_during_steps(llm: LLM) -> list[int]:
    """What ``gc.get_freeze_count()`` was at each of the engine's steps from now on."""
    seen: list[int] = []
    step = llm.engine.step

    def counted() -> list[RequestOutput]:
        seen.append(gc.get_freeze_count())
        return step()

    llm.engine.step = counted  # type: ignore[method-assign]
    return seen


def test_generate_runs_with_the_heap_frozen_and_gives_it_back(tiny_llama: Path) -> None:
    """A full collection of the process's heap (torch, transformers: millions of objects) stalls a step for
    0.2 s every few dozen steps of 256 rows; generate keeps what existed out of its walks, then puts it back
    so that what the caller drops later is collected."""
    llm = LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16)
    gc.unfreeze()  # what earlier tests of this process froze (the API's app freezes its startup for good)
    seen = freeze_counts_during_steps(llm)
    llm.generate([PROMPT, "The quick brown fox"], SamplingParams(max_tokens=4, temperature=0))
    assert seen and min(seen) > 1000, seen
    assert gc.get_freeze_count() == 0


def test_generate_leaves_a_frozen_heap_frozen(tiny_llama: Path) -> None:
    """A process that froze its startup heap for good (the worker, the API) keeps it frozen."""
    llm = LLM(str(tiny_llama), kv_cache_bytes=4 << 20, block_size=16)
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        llm.generate(PROMPT, SamplingParams(max_tokens=4, temperature=0))
        assert gc.get_freeze_count() > frozen // 2  # less what was freed meanwhile
    finally:
        gc.unfreeze()
