"""The flusher thread: the worker's only writer of runs. It writes progress and results, polls cancels,
requeues what a drain's deadline catches running, and gives up unwritten runs at the end.

When the database is away, every write is kept and tried again (backing off) until it lands or the run
turns out to be lost to another worker; meanwhile the worker does not heartbeat (worker/heartbeat.py asks
``writes_work``) and says it is unhealthy.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.exc import SQLAlchemyError

from core.states import JobStatus
from worker.connectivity import Connectivity
from worker.drain import Drain
from worker.flights import Flight, Flights
from worker.health import WorkerHealth, describe
from worker.os_threads import name_this_thread
from worker.results import Clock
from worker.store import JobStore, Progress, database_away

logger = logging.getLogger("pagedq.worker")

Publish = Callable[[str, int], None]  # (job id, priority): put a job back on the broker


@dataclass
class Flusher:
    flights: Flights
    store: JobStore
    drain: Drain
    health: WorkerHealth
    worker_id: str
    flush_interval: float
    heartbeat_interval: float  # the longest retry delay
    publish: Publish
    abort: Callable[[Flight], None]  # asks the engine loop to abort a run
    connectivity: Connectivity = field(default_factory=Connectivity)
    clock: Clock = field(default_factory=Clock)
    # Set once a batch's job has ended here: its batch may be done, to finalize now (worker/reconciler.py).
    batch_jobs_ended: threading.Event = field(default_factory=threading.Event)
    # Told the ids of the jobs whose end a round committed: requests waiting for them hear it at once
    # (core/streams.end_announcer); None without Redis.
    announce_ended: Callable[[list[str]], None] | None = None
    # A batch's lines' progress: nobody reads it but a run that resumes them, and at a few hundred lines
    # rewriting each every flush interval was most of PostgreSQL's work (bench/RESULTS.md, 2026-11-27).
    # None: with every progress round.
    lines_interval: float | None = None

    def __post_init__(self) -> None:
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pagedq-flusher", daemon=True)
        self._failures = 0  # rounds failed in a row
        self._progress_at = -float("inf")  # when a round last wrote every run's progress (monotonic)
        self._lines_at = -float("inf")  # when a round last wrote the batch lines' progress too

    def start(self) -> None:
        self._thread.start()

    def writes_work(self) -> bool:
        """Whether the last round went through (or none has failed yet)."""
        return self._failures == 0

    def begin_drain(self, grace: float) -> None:
        """Stop taking jobs; jobs still running after ``grace`` seconds are requeued. Writes that fail are
        retried the drain's write grace more; then those runs end unwritten (their messages go back)."""
        logger.info("draining", extra={"grace_s": grace, "running_jobs": len(self.flights)})
        self.drain.begin(grace)
        self.flights.wake.set()

    def stop(self) -> None:
        """Requeue whatever still runs and write what is unwritten (until the give-up time), then stop."""
        self.begin_drain(0.0)
        while self.flights and self._thread.is_alive():
            time.sleep(0.05)
        self._stopping.set()
        self.flights.wake.set()
        self._thread.join(timeout=30)
        self.health.set("stopped")

    def backoff(self, failures: int) -> float:
        """Seconds before the next try: doubling from the flush interval, at most one heartbeat period."""
        return min(self.flush_interval * 2**failures, self.heartbeat_interval)

    def _run(self) -> None:
        """Write and poll cancels. A run's end is written at once (a round as soon as one ends); progress and
        cancels every flush interval: with many runs some end at nearly every step, and writing all the
        others' few new tokens each time was most of a busy worker's writing. A failed round is tried
        again, backing off; until one succeeds the worker does not heartbeat, so after the heartbeat timeout
        other workers take its jobs over (its later writes then find them lost, and it aborts them)."""
        name_this_thread("pagedq-flusher")
        failing_since = 0.0
        while not (self._stopping.is_set() and not self.flights):
            self.flights.wake.wait(self._next_round_in())
            self.flights.wake.clear()
            now = time.monotonic()
            progress = now - self._progress_at >= self.flush_interval
            lines = progress and now - self._lines_at >= (self.lines_interval or 0.0)
            try:
                self._flush(progress, lines)
                if progress:
                    self._progress_at = time.monotonic()
                    self._poll_cancellations()
                if lines:
                    self._lines_at = self._progress_at
            except Exception as error:
                self._failures += 1
                failing_since = failing_since or time.monotonic()
                self._failed(error, self._failures)
                time.sleep(self.backoff(self._failures))  # not cut short by a stop: it retries as long
            else:
                if self._failures:
                    outage = round(time.monotonic() - failing_since, 1)
                    logger.warning(
                        "flushing works again", extra={"failed_tries": self._failures, "outage_s": outage}
                    )
                    self._failures, failing_since = 0, 0.0
                self.connectivity.succeeded()
                self.health.succeeded(jobs=len(self.flights))
            self._enforce_drain_deadline()
            self._give_up_unwritten()

    def _next_round_in(self) -> float:
        """Until progress is due, cut short by a drain deadline: a grace shorter than the interval is kept."""
        due = max(0.0, self._progress_at + self.flush_interval - time.monotonic())
        left = self.drain.seconds_to_deadline()
        return due if left is None else min(due, left)

    def _failed(self, error: Exception, failures: int) -> None:
        """One log line per failed round, naming what waits to be written."""
        if isinstance(error, SQLAlchemyError) and database_away(error):
            self.connectivity.failed()
        self.health.failed(error)
        waiting = self.flights.waiting()
        results = [
            {"job_id": f.job.id, "attempt": f.job.attempt, "status": f.final.value}
            for f in waiting
            if f.final is not None
        ]
        logger.warning(
            "flush failed; retrying",
            exc_info=failures == 1,
            extra={
                "error": describe(error),
                "error_class": type(error).__name__,
                "failed_tries": failures,
                "retry_in_s": self.backoff(failures),
                "unwritten_jobs": len(waiting),
                "unwritten_results": results[:50],
            },
        )

    def _flush(self, progress: bool, lines: bool) -> None:
        with self.flights.unwritten(self.clock, progress, lines) as snapshot:
            self._store(snapshot)

    def _store(self, snapshot: list[Progress]) -> None:
        """Progress and results in one transaction, then each requeue; a run is released once its end is
        written, or once it turns out to be another run's."""
        requeues = [p for p in snapshot if p.status == JobStatus.QUEUED]
        writes = [p for p in snapshot if p.status != JobStatus.QUEUED]
        lost = self.store.write(writes) if writes else set()
        self.flights.written(writes, lost)
        ended = []  # what a request may wait for: nobody waits for a batch's line
        for p in writes:
            if p.status is not None and p.job_id in lost:
                logger.warning("result not written: the job is no longer ours", extra={"job_id": p.job_id})
            if p.status is not None or p.job_id in lost:
                flight = self._release(p.job_id, lost=p.job_id in lost and p.status is None)
                if flight.job.in_batch and p.job_id not in lost:
                    self.batch_jobs_ended.set()
                elif p.job_id not in lost:
                    ended.append(p.job_id)
        if ended and self.announce_ended is not None:
            self.announce_ended(ended)
        for p in requeues:
            priority = self.store.requeue(p.job_id, p.attempt)
            if priority is not None:
                self._publish_requeued(p.job_id, priority)
            self._release(p.job_id, lost=False)

    def _publish_requeued(self, job_id: str, priority: int) -> None:
        try:
            self.publish(job_id, priority)
        except Exception as error:  # the row is queued: the reconciler republishes a job without a message
            logger.warning(
                "could not publish a requeued job", extra={"job_id": job_id, "error": describe(error)}
            )

    def _release(self, job_id: str, lost: bool) -> Flight:
        flight = self.flights.release(job_id)
        if lost:  # another run owns the job now (we were presumed dead) or it was deleted
            logger.warning("job no longer ours; aborting", extra={"job_id": job_id})
            self.abort(flight)
        flight.done.set()
        return flight

    def _give_up_unwritten(self) -> None:
        """Past the give-up time, runs whose end is still unwritten are released as such: their messages go
        back to the broker, and their rows (still running, ours) are requeued once our heartbeat ages."""
        if not self.drain.past_give_up():
            return
        flights = self.flights.release_all()
        if flights:
            jobs = [{"job_id": f.job.id, "attempt": f.job.attempt} for f in flights]
            logger.error("shutting down with runs unwritten; their messages go back", extra={"jobs": jobs})
        for flight in flights:
            flight.unwritten = True
            self.abort(flight)
            flight.done.set()

    def _poll_cancellations(self) -> None:
        if running := self.flights.running():
            for job_id in self.store.cancel_requested(running):
                self._abort(job_id, JobStatus.CANCELLED)

    def _enforce_drain_deadline(self) -> None:
        """Past the deadline, running jobs are requeued at once, not after the engine's step ends (a long
        prefill's can take many seconds): the grace is a promise. Their aborts come out of the engine
        later, to runs already let go."""
        if self.drain.past_deadline():
            for job_id in self.flights.running():
                if (flight := self._abort(job_id, JobStatus.QUEUED)) is not None:
                    self.flights.end(flight, JobStatus.QUEUED, finish_reason="abort")

    def _abort(self, job_id: str, abort_as: JobStatus) -> Flight | None:
        if (flight := self.flights.mark_abort(job_id, abort_as)) is not None:
            logger.info("aborting job", extra={"job_id": job_id, "as": abort_as.value})
            self.abort(flight)
        return flight
