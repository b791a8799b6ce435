"""The worker's writer alone (worker/flusher.py), on the real PostgreSQL without Celery or an engine: the test
plays the engine loop (it ends runs, and records the aborts the flusher asks for). Progress and results are
written and runs let go; cancels and a drain's deadline abort runs as asked, a requeue is published; a run
another worker took over is aborted; writes wait out a database outage, unhealthy meanwhile, and a drain
gives up what it still cannot write."""

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from core.db import make_db_engine, make_sessionmaker
from core.models import Job
from core.settings import Settings
from core.states import JobStatus
from tests.support.roles import MODEL, add_job, database_away, row
from tests.support.services import wait_for
from worker.claimer import Claimer
from worker.drain import Drain
from worker.engine import CompletionOutput, RequestMetrics, RequestOutput
from worker.flights import Flight, Flights
from worker.flusher import Flusher
from worker.health import WorkerHealth, check
from worker.results import JobResult
from worker.store import JobStore


@pytest.fixture
def store(service_settings: Settings) -> Iterator[JobStore]:
    engine = make_db_engine(service_settings)
    yield JobStore(make_sessionmaker(engine), MODEL)
    engine.dispose()


class Recorder:
    """The flusher's view of the engine loop and the broker: what it asked to abort and to publish."""

    def __init__(self) -> None:
        self.aborted: list[Flight] = []
        self.published: list[tuple[str, int]] = []
        self.announced: list[str] = []  # the ended jobs announced to waiting requests

    def publish(self, job_id: str, priority: int) -> None:
        self.published.append((job_id, priority))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def flusher(store: JobStore, recorder: Recorder, tmp_path: Path) -> Iterator[Flusher]:
    health = WorkerHealth(tmp_path / "worker-status.json", refresh_every=1.0, worker_id="w1")
    writer = Flusher(
        Flights(),
        store,
        Drain(write_grace=0.5),
        health,
        "w1",
        flush_interval=0.05,
        heartbeat_interval=0.2,
        publish=recorder.publish,
        abort=recorder.aborted.append,
        announce_ended=recorder.announced.extend,
    )
    writer.start()
    yield writer
    writer.stop()


def claimed(store: JobStore, flights: Flights) -> Flight:
    """A queued job claimed by this worker, its run held, as the claimer leaves it."""
    job = store.claim(add_job(store), "w1")
    assert job is not None
    run = Flight(job, JobResult.of(job.params))
    flights.add(run)
    return run


def produce(flights: Flights, run: Flight, text: str) -> None:
    """One token of output, folded in as the engine loop does."""
    now = time.monotonic()
    sample = CompletionOutput(0, text, [7])
    output = RequestOutput(
        run.request_id, None, [1], [sample], False, RequestMetrics(now, now, now, None, [now])
    )
    flights.fold(run, output, lambda token: text)


def health_line(flusher: Flusher) -> str:
    return check(flusher.health.path, stale_after=60)[1]


def test_progress_then_the_result_is_written_and_the_run_let_go(store, flusher, recorder):
    run = claimed(store, flusher.flights)
    produce(flusher.flights, run, "Once")
    wait_for(lambda: row(store, run.job.id).output_text == "Once", 10, "the progress to be written")
    assert not run.done.is_set()

    assert recorder.announced == []  # progress is no end
    produce(flusher.flights, run, " upon")
    flusher.flights.end(run, JobStatus.SUCCEEDED, finish_reason="length")
    assert run.done.wait(10)
    wait_for(lambda: recorder.announced == [run.job.id], 10, "its end to be announced, once")
    job = row(store, run.job.id)
    assert (job.status, job.output_text, job.completion_tokens, job.finish_reason) == (
        "succeeded",
        "Once upon",
        2,
        "length",
    )
    assert len(flusher.flights) == 0 and not run.unwritten
    assert health_line(flusher).startswith("healthy")


def test_a_cancel_request_aborts_the_run_which_ends_cancelled(store, flusher, recorder):
    run = claimed(store, flusher.flights)
    with store.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == run.job.id).values(cancel_requested=True))
    wait_for(lambda: recorder.aborted, 10, "the cancel to be polled")
    assert recorder.aborted == [run] and run.abort_as == JobStatus.CANCELLED

    flusher.flights.end(run, JobStatus.CANCELLED, finish_reason="abort")  # the engine's abort came out
    assert run.done.wait(10) and row(store, run.job.id).status == JobStatus.CANCELLED
    assert recorder.aborted == [run]  # asked once


def test_a_drain_requeues_and_publishes_the_runs_its_deadline_finds_running(store, flusher, recorder):
    run, done = claimed(store, flusher.flights), claimed(store, flusher.flights)
    flusher.flights.end(done, JobStatus.SUCCEEDED, finish_reason="stop")
    flusher.begin_drain(grace=0.0)
    wait_for(lambda: recorder.aborted, 10, "the drain's deadline to abort the running job")
    assert recorder.aborted == [run] and run.abort_as == JobStatus.QUEUED

    flusher.flights.end(run, JobStatus.QUEUED, finish_reason="abort")
    assert run.done.wait(10) and done.done.wait(10)
    assert recorder.published == [(run.job.id, 0)]
    assert row(store, run.job.id).status == JobStatus.QUEUED and row(store, done.job.id).status == "succeeded"
    assert not run.unwritten
    wait_for(lambda: recorder.announced, 10, "the ended job to be announced")
    assert recorder.announced == [done.job.id]  # a requeue is no end

    flusher.stop()  # and says so
    assert health_line(flusher) == "stopped: worker w1"


def test_a_run_another_worker_took_over_is_aborted_and_let_go(store, flusher, recorder):
    run = claimed(store, flusher.flights)
    with store.sessions.begin() as session:  # we were presumed dead: the job runs elsewhere now
        session.execute(update(Job).where(Job.id == run.job.id).values(attempt=2, worker_id="w2"))
    produce(flusher.flights, run, "stale")
    assert run.done.wait(10)
    assert recorder.aborted == [run] and not run.unwritten
    job = row(store, run.job.id)
    assert (job.attempt, job.worker_id, job.output_text) == (2, "w2", "")


def test_writes_wait_out_a_database_outage_and_the_worker_is_unhealthy_meanwhile(
    service_settings, store, flusher
):
    run = claimed(store, flusher.flights)
    wait_for(lambda: health_line(flusher).startswith("healthy"), 10, "a first round to go through")
    with database_away(service_settings.database_url):
        produce(flusher.flights, run, "kept")
        flusher.flights.end(run, JobStatus.SUCCEEDED, finish_reason="length")
        unhealthy = "unhealthy: cannot write to the database since"
        wait_for(lambda: health_line(flusher).startswith(unhealthy), 10, "the worker to say it is unhealthy")
        assert not run.done.is_set()
    assert run.done.wait(30)
    job = row(store, run.job.id)
    assert (job.status, job.output_text) == ("succeeded", "kept")
    wait_for(lambda: health_line(flusher).startswith("healthy"), 10, "the worker to be healthy again")


def test_a_drain_gives_up_the_runs_it_still_cannot_write_and_they_go_back(
    service_settings, store, flusher, recorder
):
    run = claimed(store, flusher.flights)
    with database_away(service_settings.database_url):
        flusher.flights.end(run, JobStatus.SUCCEEDED, finish_reason="length")
        flusher.begin_drain(grace=0.0)  # writes are retried for the drain's write grace, then given up
        assert run.done.wait(10)
        assert run.unwritten and recorder.aborted == [run] and len(flusher.flights) == 0
    job = row(store, run.job.id)  # still running, ours: requeued once our heartbeat ages
    assert (job.status, job.worker_id) == (JobStatus.RUNNING, "w1")


def test_a_claimed_run_says_when_it_started_before_the_engine_has_produced_anything(store, flusher):
    job_id = add_job(store)
    started: list[Flight] = []
    claimer = Claimer(flusher.flights, store, "w1", flusher.drain, started.append, lambda _: 0.05)
    run = claimer.claim(job_id)
    assert isinstance(run, Flight)
    # A long prefill: no output yet. The job is running, and says since when.
    job = wait_for(
        lambda: (j := row(store, job_id)).started_at is not None and j, 10, "started_at to be written"
    )
    assert job.status == JobStatus.RUNNING and job.first_token_at is None
    produce(flusher.flights, run, "late")  # the engine's first output, its step long after the claim
    wait_for(lambda: row(store, job_id).first_token_at is not None, 10, "the first token to be written")
    after = row(store, job_id)
    assert after.started_at == job.started_at <= after.first_token_at
    assert after.token_times_ms[0] >= 0


def unstarted(
    store: JobStore, recorder: Recorder, tmp_path: Path, flush_interval: float, **fields: Any
) -> Flusher:
    """A flusher of its own flights, not started: the test sets its runs up before the first round."""
    health = WorkerHealth(tmp_path / "worker-status.json", refresh_every=1.0, worker_id="w1")
    return Flusher(
        Flights(),
        store,
        Drain(write_grace=0.5),
        health,
        "w1",
        flush_interval,
        0.2,
        recorder.publish,
        recorder.aborted.append,
        **fields,
    )


def test_an_end_is_written_at_once_and_the_other_runs_progress_waits_for_the_flush_interval(
    store, recorder, tmp_path
):
    writer = unstarted(store, recorder, tmp_path, flush_interval=600.0)
    flights = writer.flights
    ending, going_on = claimed(store, flights), claimed(store, flights)
    produce(flights, going_on, "Once")
    writer.start()  # its first round writes every run's progress; the next is due in 600 s
    try:
        wait_for(lambda: row(store, going_on.job.id).output_text == "Once", 10, "the first progress")
        produce(flights, going_on, " upon")
        flights.end(ending, JobStatus.SUCCEEDED, finish_reason="stop")
        assert ending.done.wait(10), "an end waited for the flush interval"
        assert row(store, ending.job.id).status == JobStatus.SUCCEEDED
        assert row(store, going_on.job.id).output_text == "Once", "a round for an end wrote all progress"
        assert going_on.dirty
    finally:
        flights.end(going_on, JobStatus.SUCCEEDED, finish_reason="stop")
        writer.stop()
    assert row(store, going_on.job.id).output_text == "Once upon"


def test_a_batch_lines_progress_waits_for_its_own_interval_and_its_end_does_not(store, recorder, tmp_path):
    """Nobody reads a batch line's partial output but a run that resumes it: its progress is written every
    ``lines_interval``, a single job's every flush interval, and each end at once."""
    writer = unstarted(store, recorder, tmp_path, flush_interval=0.05, lines_interval=600.0)
    flights = writer.flights
    job = claimed(store, flights)
    line = claimed(store, flights)
    line.job = replace(line.job, in_batch=True)
    for run in (job, line):
        produce(flights, run, "Once")
    writer.start()  # its first round writes every run's progress, the lines' too; theirs is next due in 600 s
    try:
        wait_for(lambda: row(store, line.job.id).output_text == "Once", 10, "the first progress")
        for run in (job, line):
            produce(flights, run, " upon")
        wait_for(lambda: row(store, job.job.id).output_text == "Once upon", 10, "the job's next progress")
        assert row(store, line.job.id).output_text == "Once" and line.dirty
        produce(flights, line, " a time")
        flights.end(line, JobStatus.SUCCEEDED, finish_reason="length")
        assert line.done.wait(10), "a line's end waited for its progress interval"
        assert row(store, line.job.id).output_text == "Once upon a time"
    finally:
        flights.end(job, JobStatus.SUCCEEDED, finish_reason="stop")
        writer.stop()


def test_a_drain_deadline_sooner_than_the_flush_interval_is_waited_for_not_slept_past() -> None:
    from worker.drain import Drain

    drain = Drain(write_grace=1.0)
    assert drain.seconds_to_deadline() is None  # not draining: the flusher waits its interval
    drain.begin(0.3)
    assert 0 < drain.seconds_to_deadline() <= 0.3  # the flusher's next round comes at the deadline
    drain.begin(0.0)
    assert drain.seconds_to_deadline() is None  # past it: back to the interval, no busy loop
