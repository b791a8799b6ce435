"""worker/results.py, the pure shaping of a run's result: no engine, no database."""

from datetime import UTC, datetime

import pytest

from core.choices import choices_of
from core.models import Job
from core.openai_format import completion_body
from core.states import JobStatus
from core.timings import joined, timings
from worker.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from worker.results import Clock, JobResult
from worker.store import Resume

pytestmark = pytest.mark.fast

TEXTS = {1: "a", 2: "b", 3: "c\x00"}
CLOCK = Clock(offset=1_000_000.0)


def step(
    times: list[float], *samples: CompletionOutput, finished: bool = False, cached: int = 0
) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=9.0, first_scheduled_time=10.0, first_token_time=10.5)
    metrics.token_times = times  # this step's new tokens' times, as the engine hands them out
    return RequestOutput("job_1", None, [7], list(samples), finished, metrics, cached)


def sample(index: int, text: str, tokens: list[int], reason: str | None = None, **extra) -> CompletionOutput:
    return CompletionOutput(index, text, tokens, finish_reason=reason, **extra)


def test_steps_fold_into_text_tokens_and_times_in_ms_since_started() -> None:
    result = JobResult.of({})
    result.fold(step([10.5], sample(0, "Hel", [1])), TEXTS.get)
    result.fold(step([10.75, 11.0], sample(0, "lo", [2, 3], "length"), cached=4), TEXTS.get)

    p = result.progress("job_1", 2, CLOCK, JobStatus.SUCCEEDED, "length")
    assert (p.output_text, p.completion_tokens, p.cached_tokens, p.choices) == ("Hello", 3, 4, None)
    assert p.token_times_ms == [500.0, 750.0, 1000.0] and p.token_times_from == 0
    assert p.started_at == datetime.fromtimestamp(1_000_010.0, UTC)
    assert p.first_token_at == datetime.fromtimestamp(1_000_010.5, UTC)
    assert (p.attempt, p.status, p.finish_reason, p.token_logprobs) == (
        2,
        JobStatus.SUCCEEDED,
        "length",
        None,
    )


def test_a_snapshot_holds_only_the_text_and_times_not_yet_written() -> None:
    result = JobResult.of({})
    result.fold(step([10.001, 10.002], sample(0, "ab", [1, 2])), TEXTS.get)
    first = result.progress("job_1", 1, CLOCK)
    result.written(first)
    result.fold(step([10.003], sample(0, "c", [3])), TEXTS.get)
    unwritten = result.progress("job_1", 1, CLOCK)  # its write fails: no written()
    result.fold(step([10.004], sample(0, "a", [1])), TEXTS.get)
    retry = result.progress("job_1", 1, CLOCK)

    assert (first.token_times_ms, first.token_times_from) == ([1.0, 2.0], 0)
    assert (unwritten.token_times_ms, unwritten.token_times_from) == ([3.0], 2)
    assert (retry.token_times_ms, retry.token_times_from) == ([3.0, 4.0], 2)  # nothing lost
    result.written(retry)
    result.written(unwritten)  # a late acknowledgement of an older snapshot does not go back
    assert result.progress("job_1", 1, CLOCK).token_times_ms == []
    chunks = [(p.token_times_from, p.token_times_ms) for p in (first, unwritten, retry)]
    assert joined(chunks) == [1.0, 2.0, 3.0, 4.0]  # the overlapping chunk counts each token once
    texts = [(p.text_from, p.output_text) for p in (first, unwritten, retry)]
    assert texts == [(0, "ab"), (2, "c"), (2, "ca")]
    assert result.progress("job_1", 1, CLOCK).output_text == ""


def test_samples_fill_their_choices_and_every_choice_is_stored() -> None:
    result = JobResult.of({"n": 2})
    result.fold(step([10.1], sample(0, "a", [1]), sample(1, "b", [2])), TEXTS.get)
    result.fold(step([10.2], sample(0, "b", [2], "stop"), sample(1, "a", [1], "length")), TEXTS.get)

    p = result.progress("job_1", 1, CLOCK, JobStatus.SUCCEEDED, "stop")
    assert p.output_text == "ab" and p.completion_tokens == 4
    assert p.choices == [
        {"text": "ab", "finish_reason": "stop", "completion_tokens": 2},
        {"text": "ba", "finish_reason": "length", "completion_tokens": 2},
    ]


def test_logprobs_are_stored_as_text_best_first_with_the_final_result_only() -> None:
    result = JobResult.of({"logprobs": 2})
    top = {3: -0.1, 1: -3.0, 2: -1.0}  # the chosen token is the best one here
    result.fold(step([10.1], sample(0, "c", [3], logprobs=[top])), TEXTS.get)
    assert result.progress("job_1", 1, CLOCK).token_logprobs is None  # partial writes stay small
    chosen_worse = {2: -0.5, 3: -0.2, 1: -0.9}
    result.fold(step([10.2], sample(0, "a", [1], "length", logprobs=[chosen_worse])), TEXTS.get)

    p = result.progress("job_1", 1, CLOCK, JobStatus.SUCCEEDED, "length")
    assert p.token_logprobs == [
        [
            {"token": "c\ufffd", "logprob": -0.1, "top": [("c\ufffd", -0.1), ("b", -1.0)]},
            {"token": "a", "logprob": -0.9, "top": [("c\ufffd", -0.2), ("b", -0.5)]},
        ]
    ]


def test_a_stored_result_reads_back_as_the_api_serves_it() -> None:
    result = JobResult.of({"logprobs": 1})
    top = {1: -0.25, 2: -2.0}
    result.fold(step([10.5], sample(0, "a", [1], "length", logprobs=[top])), TEXTS.get)
    p = result.progress("job_1", 1, CLOCK, JobStatus.SUCCEEDED, "length")
    job = Job(id="job_1", model="m", prompt_tokens=3, output_text=p.text()["text_piece"], **p.columns())

    [choice] = choices_of(job)
    assert (choice.text, choice.finish_reason, choice.completion_tokens) == ("a", "length", 1)
    chat = completion_body(job, "/v1/chat/completions", 0)["choices"][0]["logprobs"]["content"]
    assert chat == [
        {
            "token": "a",
            "logprob": -0.25,
            "bytes": [97],
            "top_logprobs": [{"token": "a", "logprob": -0.25, "bytes": [97]}],
        }
    ]
    text = completion_body(job, "/v1/completions", 0)["choices"][0]["logprobs"]
    assert text == {
        "tokens": ["a"],
        "token_logprobs": [-0.25],
        "top_logprobs": [{"a": -0.25}],
        "text_offset": [0],
    }


def test_derived_timings_round_to_the_microsecond() -> None:
    queued = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
    job = Job(queued_at=queued, started_at=queued.replace(microsecond=100_400))
    job.first_token_at, job.finished_at = queued.replace(microsecond=150_000), queued.replace(second=1)
    figures = timings(job)  # a new job has no run yet, so no token times
    assert (figures.queue_time_ms, figures.time_to_first_token_ms, figures.e2e_latency_ms) == (
        100.4,
        49.6,
        1000.0,
    )
    assert figures.mean_time_per_output_token_ms is None and figures.inter_token_ms == []


def test_a_resumed_run_starts_from_the_earlier_runs_tokens_and_keeps_its_start() -> None:
    started = datetime(2026, 1, 1, tzinfo=UTC)
    earlier = Resume(
        [1, 2], [100.0, 200.0], "ab", started, datetime(2026, 1, 1, 0, 0, 0, 100_000, tzinfo=UTC)
    )
    result = JobResult.of({"n": 1}, started=5.0, resume=earlier)
    result.fold(step([], sample(0, "c", [3], "length")), TEXTS.get)  # the times of the new token aside
    p = result.progress("job_1", 2, CLOCK, JobStatus.SUCCEEDED, "length")
    assert (p.output_text, p.text_from, p.completion_tokens) == ("c", 2, 3)
    assert (p.started_at, p.first_token_at) == (earlier.started_at, earlier.first_token_at)
    assert p.output_token_ids == [[1, 2, 3]] and p.token_times_from == 2


def test_each_flush_carries_the_first_choices_token_ids_beside_their_times_but_beams_do_not() -> None:
    result = JobResult.of({"n": 2})
    result.fold(step([10.1], sample(0, "a", [1]), sample(1, "b", [2])), TEXTS.get)
    first = result.progress("job_1", 1, CLOCK)
    assert (first.token_ids, first.token_times_ms) == ([1], [100.0])
    result.written(first)
    result.fold(step([10.2, 10.3], sample(0, "bc", [2, 3], "length"), sample(1, "", [], "length")), TEXTS.get)
    final = result.progress("job_1", 1, CLOCK, JobStatus.SUCCEEDED, "length")
    assert (final.token_ids, final.token_times_from, final.output_token_ids) == ([2, 3], 1, [[1, 2, 3], [2]])
    beams = JobResult.of({"use_beam_search": True})
    beams.fold(step([10.1], sample(0, "a", [1])), TEXTS.get)
    assert beams.progress("job_1", 1, CLOCK).token_ids is None
