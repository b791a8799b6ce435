"""The worker's engine thread alone (worker/engine_loop.py), without Celery or a database: runs handed to it
batch in the tiny model's engine and end with what the engine alone generates; aborts end a run as asked;
what the engine refuses, or a step that raises, fails runs instead of hanging them.
"""

import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from core.states import JobStatus
from core.streams import WATCHED_KEY, announce_reader, stream_key
from tests.support.services import redis_url, wait_for
from worker.engine import (
    LLM,
    CompletionOutput,
    EngineConfig,
    EngineStats,
    LLMEngine,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
)
from worker.engine_loop import EngineLoop
from worker.flights import Flight, Flights
from worker.results import JobResult
from worker.store import ClaimedJob
from worker.streamer import TokenStreamer

GREEDY = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}
PROMPTS = ["The quick brown fox", "Paged attention stores keys and values in", "Hello there"]


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> LLM:
    """The same weights, run by the engine alone."""
    return LLM(str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=16 << 20)


@pytest.fixture
def flights() -> Flights:
    return Flights()


@pytest.fixture
def loop(tiny_llama: Path, flights: Flights) -> Iterator[EngineLoop[LLMEngine]]:
    config = EngineConfig(model=str(tiny_llama), device="cpu", dtype="float32", kv_cache_bytes=16 << 20)
    engine_loop = EngineLoop(lambda: LLMEngine(config), flights)
    yield engine_loop
    engine_loop.stop()


def flight(prompt_ids: list[int], attempt: int = 1, job_id: str = "", **params: Any) -> Flight:
    job_id = job_id or f"job_{uuid.uuid4().hex[:12]}"
    job = ClaimedJob(job_id, attempt, prompt_ids, params, priority=0, in_batch=params.pop("in_batch", False))
    return Flight(job, JobResult.of(job.params))


def hand_over(loop: EngineLoop[Any], flights: Flights, *runs: Flight) -> None:
    """As the claimer does: the run is held, then added to the engine."""
    for run in runs:
        flights.add(run)
        loop.add(run)


def ended(*runs: Flight) -> bool:
    return all(run.final is not None for run in runs)


def test_runs_batch_together_and_end_with_what_the_engine_alone_generates(reference, flights, loop):
    url = redis_url()
    loop.streamer = TokenStreamer(url)
    ids = [reference.tokenizer.encode(prompt) for prompt in PROMPTS]
    runs = [flight(prompt_ids, **GREEDY) for prompt_ids in ids]
    batch_run, unread_run = flight(ids[0], **GREEDY, in_batch=True), flight(ids[1], **GREEDY)
    pipe = redis.Redis.from_url(url).pipeline()
    for run in [*runs, batch_run]:  # a reader follows each but one
        announce_reader(pipe, run.job.id)
    pipe.execute()
    watchers = loop.streamer.watchers
    wait_for(lambda: all(watchers.watched(run.job.id) for run in runs), 10, "the worker to see the readers")
    hand_over(
        loop, flights, *runs, batch_run, unread_run
    )  # before the engine is built: all join its first step
    flights.wake.clear()

    loop.start()
    wait_for(lambda: ended(*runs, batch_run), 60, "every run to end")
    loop.streamer.close()
    expected = [out.outputs[0].text for out in reference.generate(ids, SamplingParams(**GREEDY))]
    assert [run.result.choices[0].text for run in [*runs, batch_run, unread_run]] == [
        *expected,
        expected[0],
        expected[1],
    ]
    assert all(run.final == JobStatus.SUCCEEDED and run.finish_reason == "length" for run in runs)
    assert all(len(run.result.token_times_ms) == 8 == run.result.choices[0].completion_tokens for run in runs)
    assert loop.stats()["peak_running"] == 5 and loop.stats()["num_running"] == 0
    assert flights.wake.is_set()  # an end wakes the flusher to write it at once

    broker = redis.Redis.from_url(url)
    try:  # a read run's new text is streamed live; a batch's jobs (their readers follow the row) and a
        # run nobody reads are not
        entries = [broker.xrange(stream_key(run.job.id)) for run in runs]
        texts = ["".join(fields.get(b"text", b"").decode() for _, fields in run) for run in entries]
        assert texts == expected and all(run[-1][1].get(b"end") == b"1" for run in entries)
        assert not broker.exists(stream_key(batch_run.job.id)) and not broker.exists(
            stream_key(unread_run.job.id)
        )
    finally:
        broker.delete(*(stream_key(run.job.id) for run in runs))
        broker.zrem(WATCHED_KEY, *(run.job.id for run in [*runs, batch_run]))


def test_a_readers_first_token_makes_the_engine_yield_once_before_its_next_step(reference, flights, loop):
    """The step that opens a read run's stream is followed by the streamer's ``first_token_yield``, before
    the next step (its run has one token then); a run nobody reads, a batch line, and a read run's later
    tokens are not; a stream opened within ``YIELD_EVERY_STEPS`` steps of the last yield is not either."""
    url = redis_url()
    loop.streamer = TokenStreamer(url, first_token_yield=0.002)
    ids = [reference.tokenizer.encode(prompt) for prompt in PROMPTS]
    read, unread, line = (
        flight(ids[0], **GREEDY),
        flight(ids[1], **GREEDY),
        flight(ids[2], **GREEDY, in_batch=True),
    )
    soon, later = flight(ids[1], **GREEDY), flight(ids[2], **GREEDY)
    runs = [read, unread, line, soon, later]
    pauses: list[tuple[float, list[int]]] = []
    loop.pause = lambda seconds: pauses.append((seconds, [len(r.result.token_times_ms) for r in runs]))
    pipe = redis.Redis.from_url(url).pipeline()
    for run in (read, line, soon, later):
        announce_reader(pipe, run.job.id)
    pipe.execute()
    watchers = loop.streamer.watchers
    wait_for(lambda: all(watchers.watched(r.job.id) for r in runs if r is not unread), 10, "the readers")
    try:
        hand_over(loop, flights, read, unread, line)  # one step each token: 8 steps
        loop.start()
        wait_for(lambda: ended(read, unread, line), 60, "the first runs to end")
        hand_over(loop, flights, soon)  # its first token 8 steps after the yield: none
        wait_for(lambda: ended(soon), 60, "the second read run to end")
        hand_over(loop, flights, later)  # 16 steps after it: a yield
        wait_for(lambda: ended(later), 60, "the third read run to end")
    finally:
        loop.streamer.close()
        broker = redis.Redis.from_url(url)
        broker.delete(*(stream_key(r.job.id) for r in runs))
        broker.zrem(WATCHED_KEY, *(r.job.id for r in runs))
    assert pauses == [(0.002, [1, 1, 1, 0, 0]), (0.002, [8, 8, 8, 8, 1])]


def test_an_aborted_run_ends_as_its_abort_asked_and_frees_the_engine(reference, flights, loop):
    loop.start()
    run = flight(reference.tokenizer.encode(PROMPTS[0]), temperature=0.0, max_tokens=500, ignore_eos=True)
    hand_over(loop, flights, run)
    wait_for(lambda: run.result.choices[0].completion_tokens > 0, 30, "the run's first tokens")

    assert flights.mark_abort(run.job.id, JobStatus.CANCELLED) is run
    assert flights.mark_abort(run.job.id, JobStatus.QUEUED) is None  # the first reason stands
    loop.abort(run)
    wait_for(lambda: ended(run), 30, "the abort to end the run")
    assert (run.final, run.finish_reason) == (JobStatus.CANCELLED, "abort")
    assert 0 < run.result.choices[0].completion_tokens < 500
    wait_for(lambda: loop.stats()["kv_cache_usage"] == 0, 10, "the engine to free the run's blocks")


def test_a_job_s_next_run_joins_while_the_last_one_s_abort_drains_out(reference, flights, loop):
    loop.start()
    prompt_ids = reference.tokenizer.encode(PROMPTS[1])
    stale = flight(prompt_ids, temperature=0.0, max_tokens=500, ignore_eos=True)
    hand_over(loop, flights, stale)
    wait_for(lambda: stale.result.choices[0].completion_tokens > 0, 30, "the first run's first tokens")
    assert flights.release(stale.job.id) is stale  # let go (lost to another worker, say), then aborted
    loop.abort(stale)
    rerun = flight(prompt_ids, attempt=2, job_id=stale.job.id, **GREEDY)
    hand_over(loop, flights, rerun)

    wait_for(lambda: ended(rerun), 30, "the next run to end")
    [expected] = reference.generate([prompt_ids], SamplingParams(**GREEDY))
    assert (
        rerun.request_id == f"{stale.job.id}#2" and rerun.result.choices[0].text == expected.outputs[0].text
    )
    assert rerun.final == JobStatus.SUCCEEDED and stale.final is None  # the old run's abort was not its


def test_what_the_engine_refuses_fails_its_run_with_the_reason(reference, flights, loop):
    loop.start()
    prompt_ids = reference.tokenizer.encode(PROMPTS[0])
    too_long, unknown = flight(prompt_ids, max_tokens=10**6), flight(prompt_ids, nonsense=1)
    hand_over(loop, flights, too_long, unknown)
    wait_for(lambda: ended(too_long, unknown), 30, "both runs to fail")
    assert too_long.final == unknown.final == JobStatus.FAILED
    assert too_long.error is not None and too_long.error.startswith("rejected by the engine: ")
    assert "exceeds the model's context" in too_long.error and "nonsense" in (unknown.error or "")


class ScriptedEngine:
    """A double of the engine (worker/engine_loop.py's ``Engine``): each step gives every request one
    token and finishes it, except the steps told to raise."""

    def __init__(self, failing_steps: int, while_failing: Callable[[], None] = lambda: None) -> None:
        self.failing_steps, self.while_failing = failing_steps, while_failing
        self.requests: list[str] = []
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.tokenizer = SimpleNamespace(decode=lambda token_ids: "x")

    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        priority: int,
        continue_from: list[int] | None = None,
    ) -> None:
        self.requests.append(request_id)
        self.added.append(request_id)

    def abort(self, request_id: str) -> bool:
        if request_id not in self.requests:
            return False
        self.aborted.append(request_id)
        self.requests.remove(request_id)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        if self.failing_steps and self.requests:
            self.failing_steps -= 1
            self.while_failing()
            raise RuntimeError("the device fell over")
        now, done, self.requests = time.monotonic(), self.requests, []
        token = [CompletionOutput(0, "x", [7], finish_reason="length")]
        metrics = RequestMetrics(now, now, now, now, [now])
        return [RequestOutput(request_id, None, [1], token, True, metrics) for request_id in done]

    def stats(self) -> EngineStats:
        return EngineStats(len(self.requests), 0, 0.0, 0, 0)

    def cached_prefixes(self, keys: Iterable[int]) -> list[int]:
        return []


def test_a_step_that_raises_fails_every_run_and_the_loop_goes_on(flights):
    engine = ScriptedEngine(failing_steps=1)
    loop = EngineLoop(lambda: engine, flights)
    broken = [flight([1, 2]), flight([3])]
    hand_over(loop, flights, *broken)
    loop.start()
    try:
        wait_for(lambda: ended(*broken), 10, "the failed step to end its runs")
        assert all(run.final == JobStatus.FAILED for run in broken)
        assert broken[0].error == "engine step failed: RuntimeError('the device fell over')"
        assert engine.aborted == [run.request_id for run in broken]  # the engine is left empty

        later = flight([4])
        hand_over(loop, flights, later)
        wait_for(lambda: ended(later), 10, "a later run to end")
        assert (later.final, later.result.choices[0].text) == (JobStatus.SUCCEEDED, "x")
    finally:
        loop.stop()


def test_a_run_claimed_while_a_step_fails_ends_failed_and_never_enters_the_engine(flights):
    """Its run is failed with the step (as every unfinished run is), so the engine must not take it after:
    it would run to its max_tokens for nothing, or end it a second time, as succeeded."""
    late = flight([5])
    engine = ScriptedEngine(failing_steps=1, while_failing=lambda: hand_over(loop, flights, late))
    loop = EngineLoop(lambda: engine, flights)
    running = flight([4])
    hand_over(loop, flights, running)
    loop.start()
    try:
        wait_for(lambda: ended(running, late), 10, "the failed step to end both runs")
        later = flight([6])  # the loop has taken every command before this one when it ends
        hand_over(loop, flights, later)
        wait_for(lambda: ended(later), 10, "a later run to end")
    finally:
        loop.stop()
    assert late.final == running.final == JobStatus.FAILED and late.error == running.error
    assert engine.added == [running.request_id, later.request_id]


def test_an_engine_that_cannot_be_built_fails_the_start(flights):
    def build() -> ScriptedEngine:
        raise OSError("no weights at /models/missing")

    loop = EngineLoop(build, flights)
    with pytest.raises(RuntimeError, match="the engine could not be built: no weights at /models/missing"):
        loop.start()
