"""What a pool thread runs for a message (worker/claimer.py), on the real PostgreSQL without Celery: a claim
holds its run until its end is written; a message claims nothing it must not (a job not queued, a job
another thread claims, anything while draining); fair share's ticket takes the fairest job; a claim waits
out a database that is away, keeping its seat."""

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import event

from core.db import make_db_engine, make_sessionmaker
from core.settings import Settings
from core.states import JobStatus
from tests.support.roles import MODEL, add_job, database_away, row
from tests.support.services import wait_for
from worker.claimer import Claimer, RunResult
from worker.drain import Drain
from worker.flights import Flight, Flights
from worker.results import JobResult
from worker.store import JobStore


@pytest.fixture
def store(service_settings: Settings) -> Iterator[JobStore]:
    engine = make_db_engine(service_settings)
    yield JobStore(make_sessionmaker(engine), MODEL)
    engine.dispose()


def claimer(
    store: JobStore, started: list[Flight] | None = None, retries: list[int] | None = None
) -> Claimer:
    def retry_delay(failures: int) -> float:
        if retries is not None:
            retries.append(failures)
        return 0.05

    drain = Drain(write_grace=1.0)
    start = started.append if started is not None else lambda _: None
    return Claimer(Flights(), store, "w1", drain, start, retry_delay)


def test_a_message_s_run_is_held_until_its_end_is_written_or_given_up(store):
    written, given_up = add_job(store), add_job(store)
    started: list[Flight] = []
    pool_thread = claimer(store, started)
    with ThreadPoolExecutor(2) as pool:
        results = [pool.submit(pool_thread.run, job_id) for job_id in (written, given_up)]
        wait_for(lambda: len(started) == 2, 10, "both runs to reach the engine loop")
        runs = {run.job.id: run for run in started}
        assert pool_thread.flights.claimed_or_held() == {written, given_up}
        assert (
            runs[written].request_id == f"{written}#1" and pool_thread.flights.held(written) is runs[written]
        )
        assert not any(result.done() for result in results)  # each thread blocks until its run is let go

        runs[written].done.set()  # the flusher wrote its end
        runs[given_up].unwritten = True  # shut down with its end unwritten
        runs[given_up].done.set()
        assert [result.result(timeout=10) for result in results] == [RunResult.FINISHED, RunResult.UNWRITTEN]
    job = row(store, written)
    assert (job.status, job.attempt, job.worker_id) == (JobStatus.RUNNING, 1, "w1")


def test_a_message_whose_job_is_not_queued_claims_nothing(store):
    job_id = add_job(store)
    assert store.claim(job_id, "another worker") is not None
    pool_thread = claimer(store)
    assert pool_thread.claim(job_id) is RunResult.SKIPPED
    assert pool_thread.flights.claimed_or_held() == set() and row(store, job_id).worker_id == "another worker"


def test_a_duplicate_message_of_a_job_another_thread_is_claiming_is_dropped(store):
    job_id = add_job(store)
    pool_thread = claimer(store)
    assert pool_thread.flights.reserve(job_id, unless_held=False)  # another pool thread is claiming it
    assert pool_thread.claim(job_id) is RunResult.SKIPPED
    assert pool_thread.flights.claimed_or_held() == {job_id}  # that thread's mark stays
    assert row(store, job_id).status == JobStatus.QUEUED


def test_a_draining_worker_refuses_messages_and_claims_nothing(store):
    job_id = add_job(store)
    pool_thread = claimer(store)
    pool_thread.drain.begin(grace=30.0)
    assert pool_thread.claim(job_id) is RunResult.REFUSED
    assert row(store, job_id).status == JobStatus.QUEUED and len(pool_thread.flights) == 0


class WatchedEvent(threading.Event):
    """An event that tells when a thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.set()
        return super().wait(timeout)


def test_a_message_waiting_for_its_job_s_last_run_claims_nothing_once_the_worker_drains(store):
    """A duplicate message (or the requeue's own) waits for the run this worker still holds; if a drain
    requeued that run meanwhile, the message goes back to the broker rather than claim the job again, which
    would spend one of its PAGEDQ_MAX_ATTEMPTS on a run the drain requeues at once."""
    job_id = add_job(store)
    job = store.claim(job_id, "w1")
    assert job is not None
    pool_thread = claimer(store)
    held = Flight(job, JobResult.of(job.params), done=WatchedEvent())
    pool_thread.flights.add(held)
    with ThreadPoolExecutor(1) as pool:
        message = pool.submit(pool_thread.claim, job_id)
        assert held.done.waited.wait(10)
        pool_thread.drain.begin(grace=0.0)
        assert store.requeue(job_id, job.attempt) == 0  # the flusher requeues the drained run, lets it go
        pool_thread.flights.release(job_id)
        held.done.set()
        assert message.result(timeout=10) is RunResult.REFUSED
    requeued = row(store, job_id)
    assert (requeued.status, requeued.attempt) == (JobStatus.QUEUED, 1)
    assert pool_thread.flights.claimed_or_held() == set()


def test_with_fair_share_a_ticket_claims_the_fairest_job_then_the_next(store):
    store.fair_aging = 30.0
    later, sooner = add_job(store, priority=10), add_job(store, priority=0)
    pool_thread = claimer(store)
    first = pool_thread.claim(later)  # the message of the worse-priority job claims the better one
    second = pool_thread.claim(sooner)  # whose own message then takes the job left
    assert isinstance(first, Flight) and isinstance(second, Flight)
    assert (first.job.id, second.job.id) == (sooner, later)
    assert pool_thread.flights.claimed_or_held() == {sooner, later}


def test_with_fair_share_a_ticket_whose_job_runs_here_and_finds_none_other_queued_goes_at_once(store):
    """A fairer-first ticket took this ticket's job, and nothing else is queued yet (a burst's later jobs
    still being submitted): the ticket is spare. Parked until that run ended (as a duplicate message is,
    without fair share), it held a pool thread, one of the worker's seats, for the whole run, while the
    burst's next jobs waited for a thread: 3 of 32 jobs of bench/resume_cost.py started minutes late."""
    store.fair_aging = 30.0
    job_id = add_job(store)
    pool_thread = claimer(store)
    run = pool_thread.claim(job_id)  # another job's ticket, say, took it
    assert isinstance(run, Flight)
    with ThreadPoolExecutor(1) as pool:
        try:
            assert pool.submit(pool_thread.claim, job_id).result(timeout=10) is RunResult.SKIPPED
        finally:
            run.done.set()  # without the fix the message waits for this
    assert pool_thread.flights.claimed_or_held() == {job_id}


def test_a_claim_waits_out_a_database_that_is_away_and_then_claims(service_settings, store):
    job_id = add_job(store)
    retries: list[int] = []
    pool_thread = claimer(store, retries=retries)
    with ThreadPoolExecutor(1) as pool:
        with database_away(service_settings.database_url):
            claim = pool.submit(pool_thread.claim, job_id)
            wait_for(lambda: len(retries) >= 2, 30, "the claim to fail and retry")
            assert not claim.done()  # the thread keeps its seat meanwhile
            assert pool_thread.flights.claimed_or_held() == {job_id}
        run = claim.result(timeout=30)
    assert isinstance(run, Flight) and run.job.id == job_id and run.job.attempt == 1
    assert retries[:2] == [1, 2]  # backing off a step further each time
    assert row(store, job_id).status == JobStatus.RUNNING


def test_tickets_claiming_at_once_each_take_a_different_job_with_one_pick_and_record_its_one_run(store):
    """Sixteen tickets at once, four turns: each ticket takes its own job, once, its first run recorded by
    its claim, and with one pick: picks at once found the same fairest job, and all but one picked again
    (2.8 picks a claim at 256 tickets), each a costly statement."""
    store.fair_aging = 3600.0  # no aging step between jobs submitted within the same second
    jobs = [add_job(store, priority=i % 3) for i in range(24)]
    pool_thread = claimer(store)
    picks: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        if "fair_groups" in statement:
            picks.append(statement)

    engine = store.sessions.kw["bind"]
    event.listen(engine, "before_cursor_execute", count)
    try:
        with ThreadPoolExecutor(16) as pool:
            claims = list(pool.map(pool_thread.claim, jobs[:16]))
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(picks) == 16
    assert all(isinstance(claim, Flight) for claim in claims)
    taken = [claim.job.id for claim in claims if isinstance(claim, Flight)]
    assert len(set(taken)) == 16 and pool_thread.flights.claimed_or_held() == set(taken)
    for job_id in taken:
        claimed = row(store, job_id)
        assert (claimed.status, claimed.attempt, claimed.worker_id) == (JobStatus.RUNNING, 1, "w1")
        assert claimed.runs == [{"attempt": 1, "resumed_from_token": 0}]
    assert sorted(row(store, job_id).priority for job_id in set(jobs) - set(taken)) == [2] * 8


def test_a_pick_passes_over_jobs_being_claimed_and_ended_runs_but_not_running_ones(store):
    """A run going on is running in its row, so a pick need not be told of it (its cost would grow with the
    worker's seats); a job being claimed is still queued in its row, and so is a requeued run until the
    flusher lets its flight go."""
    running, requeued, claiming = add_job(store), add_job(store), add_job(store)
    pool_thread = claimer(store)
    flights = pool_thread.flights
    runs = {job_id: pool_thread.claim(job_id) for job_id in (running, requeued)}
    assert flights.reserve(claiming, unless_held=False)
    assert flights.passed_over() == {claiming}
    flights.end(runs[requeued], JobStatus.QUEUED, finish_reason="abort")
    assert flights.passed_over() == {claiming, requeued}
    assert flights.claimed_or_held() == {running, requeued, claiming}
