"""What a Celery pool thread runs for a job's message: claim a job, hand it to the engine loop, and block
until its end is written (late acks: only then is the message acknowledged).

With fair share the message is a ticket (worker/fair.py): it claims the fairest queued job, which another
claim may take first; then the next. Every ticket a job's claim did not use stays in the broker for some
other queued job.

The pool's threads take turns on the database (worker/connections.py): a thread holds a turn only for a
pick or a claim, never while it waits, for a retry or for its run to end.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from sqlalchemy.exc import SQLAlchemyError

from worker.connections import CLAIM_TURNS
from worker.drain import Drain
from worker.flights import Flight, Flights
from worker.health import describe
from worker.results import EmbeddingResult, JobResult
from worker.store import ClaimedJob, JobStore, database_away

logger = logging.getLogger("pagedq.worker")


class RunResult(Enum):
    FINISHED = "finished"  # the final state is committed
    SKIPPED = "skipped"  # the job was not queued (finished, cancelled, or another run owns it)
    REFUSED = "refused"  # the worker is shutting down; the message should go back to the broker
    UNWRITTEN = "unwritten"  # shut down before the result could be written; the message goes back too


@dataclass
class Claimer:
    flights: Flights
    store: JobStore
    worker_id: str
    drain: Drain
    start: Callable[[Flight], None]  # hands a claimed run to the engine loop
    retry_delay: Callable[[int], float]  # seconds before the next try after this many failed ones
    turns: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(CLAIM_TURNS))
    # A new run's result, from the claimed job and when it was claimed: its engine kind's (worker/host.py).
    result_of: Callable[[ClaimedJob, float], JobResult | EmbeddingResult] = JobResult.claimed

    def run(self, job_id: str) -> RunResult:
        flight = self.claim(job_id)
        if isinstance(flight, RunResult):
            return flight
        self.start(flight)
        flight.done.wait()
        return RunResult.UNWRITTEN if flight.unwritten else RunResult.FINISHED

    def claim(self, job_id: str) -> Flight | RunResult:
        """Claim a job for this message, retrying while the database is away: the thread keeps its seat
        meanwhile, so the worker takes no message it cannot start."""
        failures, target, chosen = 0, None, False
        try:
            while not self.drain.started:
                taken: list[str] = []  # the job reserved within ``take``, if it got so far
                try:
                    if target is None:
                        with self.turns:
                            picked, job = self.store.take(
                                job_id, self.flights.passed_over, self.worker_id, *self._marks(taken)
                            )
                        failures = 0
                        if not taken:  # reserving must wait, or be refused: the slow way
                            reserved = self._reserve(job_id, picked)
                            if reserved is None:  # a duplicate message another thread is claiming
                                return RunResult.SKIPPED
                            target, chosen = reserved
                            continue  # reserving may have waited for a run of the job, and a drain begun
                        target, chosen = taken[0], self.store.fair
                    else:
                        with self.turns:
                            job = self.store.claim(target, self.worker_id, retry=failures > 0)
                except SQLAlchemyError as error:
                    if not database_away(error):
                        raise
                    if taken:  # its claim's commit may have landed: the retry takes over its run
                        target, chosen = taken[0], self.store.fair
                    failures += 1
                    level = logging.WARNING if failures == 1 else logging.DEBUG  # the flusher logs the outage
                    logger.log(
                        level, "claim failed; retrying", extra={"job_id": job_id, "error": describe(error)}
                    )
                    time.sleep(self.retry_delay(failures))
                    continue
                if job is None and chosen:  # fair share's choice was taken first: this ticket takes the next
                    self.flights.unreserve(target)
                    target = None
                    continue
                if job is None:
                    logger.info("job not queued, skipping", extra={"job_id": job_id})
                    return RunResult.SKIPPED
                # Running from now: a job says when it started, before a long prefill ends.
                flight = Flight(job, self.result_of(job, time.monotonic()))
                self.flights.add(flight)
                return flight
            return RunResult.REFUSED
        finally:
            if target is not None:
                self.flights.unreserve(target)

    def _marks(self, taken: list[str]) -> tuple[Callable[[str], bool], Callable[[str], None]]:
        """``take``'s mark on the job it claims, in the same turn, and its release: only a job neither
        claimed nor held here, so that nothing need wait; ``taken`` holds the job marked."""

        def reserve(job_id: str) -> bool:
            if self.drain.started or not self.flights.reserve(job_id, unless_held=True):
                return False
            taken.append(job_id)
            return True

        def release(job_id: str) -> None:
            taken.remove(job_id)
            self.flights.unreserve(job_id)

        return reserve, release

    def _reserve(self, job_id: str, chosen: str | None) -> tuple[str, bool] | None:
        """The job this message's thread will claim, marked as being claimed, and whether fair share chose
        it; None if another thread is claiming the message's own job (a duplicate message), or with fair
        share when its job runs here and none other is queued (a spare ticket). ``chosen``: what the last
        pick chose."""
        while True:
            if chosen is not None and chosen != job_id:
                if self.flights.reserve(chosen, unless_held=True):
                    return chosen, True
            elif (held := self.flights.held(job_id)) is not None and self.store.fair:
                # A fairer-first ticket took its job: it picks again, and with none queued (a burst's next
                # jobs may not be committed yet) it is spare. Parked until that run ended, it would hold a
                # pool thread, a seat, while the burst's next job waited in the broker for a thread.
                if chosen is None:
                    return None
            else:
                if held is not None:  # a duplicate message, or a requeue of a run still held: it ends first
                    held.done.wait()
                if self.flights.reserve(job_id, unless_held=False):
                    return job_id, chosen is not None and self.store.fair
                if chosen is None or not self.store.fair:
                    return None
            with self.turns:  # what the others reserved while this thread waited for its turn counts
                chosen = self.store.pick(job_id, self.flights.passed_over(), self.worker_id)
