"""What the worker holds: its runs in the engine and the jobs its pool threads are claiming, under one lock.

The claimer (worker/claimer.py), the engine loop (worker/engine_loop.py) and the flusher (worker/flusher.py)
each run on threads of their own and share only this registry; it is the one place that changes what they
share, always under its lock.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from core.states import JobStatus
from worker.embedding_jobs import JobEmbedding
from worker.engine import RequestOutput
from worker.results import Clock, EmbeddingResult, JobResult, TokenText
from worker.store import ClaimedJob, Progress


@dataclass
class Flight:
    """A job in the engine: what it produced so far, and how its run ends."""

    job: ClaimedJob
    result: JobResult | EmbeddingResult  # what a generation run produced, or an embedding run
    done: threading.Event = field(default_factory=threading.Event)
    final: JobStatus | None = None
    finish_reason: str | None = None
    error: str | None = None
    abort_as: JobStatus | None = None  # why we aborted it: CANCELLED, or QUEUED to requeue it
    dirty: bool = True
    unwritten: bool = False  # given up at shutdown with its last state not written

    @property
    def request_id(self) -> str:
        """The engine's name for this run: the job's next run may join the engine before this one's
        abort has come out of it."""
        return f"{self.job.id}#{self.job.attempt}"

    def progress(self, clock: Clock) -> Progress:
        job = self.job
        return self.result.progress(job.id, job.attempt, clock, self.final, self.finish_reason, self.error)


class Flights:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}
        self._claiming: set[str] = set()  # job ids a pool thread is claiming right now (not the messages')
        # Set when a run ends (its end is written at once) and when the worker drains or stops: it cuts the
        # flusher's wait short.
        self.wake = threading.Event()

    def __len__(self) -> int:
        return len(self._flights)

    # --- claims (the claimer) ---

    def claimed_or_held(self) -> set[str]:
        with self._lock:
            return self._claiming | self._flights.keys()

    def passed_over(self) -> set[str]:
        """What a pick must pass over although its row may say queued: the jobs being claimed here, and runs
        held here that ended (a requeue's row is queued before its flight is released). A run held here
        and going on is running in its row already: not sent with every pick, whose cost grows with it."""
        with self._lock:
            return self._claiming | {job_id for job_id, f in self._flights.items() if f.final is not None}

    def reserve(self, job_id: str, unless_held: bool) -> bool:
        """Mark ``job_id`` as being claimed, unless a thread is claiming it already or (``unless_held``) it
        runs here; returns whether it was marked."""
        with self._lock:
            if job_id in self._claiming or (unless_held and job_id in self._flights):
                return False
            self._claiming.add(job_id)
            return True

    def unreserve(self, job_id: str) -> None:
        with self._lock:
            self._claiming.discard(job_id)

    def held(self, job_id: str) -> Flight | None:
        with self._lock:
            return self._flights.get(job_id)

    def add(self, flight: Flight) -> None:
        with self._lock:
            self._flights[flight.job.id] = flight

    # --- a run's state (the engine loop) ---

    def fold(self, flight: Flight, output: RequestOutput | JobEmbedding, token_text: TokenText) -> None:
        with self._lock:
            flight.result.fold(output, token_text)
            flight.dirty = True

    def end(
        self, flight: Flight, status: JobStatus, finish_reason: str | None = None, error: str | None = None
    ) -> None:
        with self._lock:
            flight.final, flight.finish_reason, flight.error = status, finish_reason, error
            flight.dirty = True
        self.wake.set()

    def unfinished(self) -> list[Flight]:
        with self._lock:
            return [f for f in self._flights.values() if f.final is None]

    def running(self) -> list[str]:
        """The jobs whose runs are neither ended nor being aborted."""
        with self._lock:
            return [f.job.id for f in self._flights.values() if f.final is None and f.abort_as is None]

    def mark_abort(self, job_id: str, abort_as: JobStatus) -> Flight | None:
        """Mark a job's run to be aborted as ``abort_as``; None if it is not held or is being aborted."""
        with self._lock:
            flight = self._flights.get(job_id)
            if flight is None or flight.abort_as is not None:
                return None
            flight.abort_as = abort_as
            return flight

    # --- writes (the flusher) ---

    @contextmanager
    def unwritten(self, clock: Clock, progress: bool = True, lines: bool = True) -> Iterator[list[Progress]]:
        """Snapshots of the runs with something unwritten (``progress`` False: only of the runs that ended;
        ``lines`` False: a batch's lines only when they ended), which count as written unless the body
        raises."""
        with self._lock:
            due = [f for f in self._flights.values() if f.dirty and _due(f, progress, lines)]
            snapshot = [f.progress(clock) for f in due]
            for f in due:
                f.dirty = False
        try:
            yield snapshot
        except BaseException:
            with self._lock:  # what was not written is written whole at the next try
                for f in due:
                    f.dirty = True
            raise

    def waiting(self) -> list[Flight]:
        """The runs with something unwritten."""
        with self._lock:
            return [f for f in self._flights.values() if f.dirty]

    def written(self, writes: list[Progress], lost: set[str]) -> None:
        with self._lock:
            for p in writes:
                if p.job_id not in lost and (flight := self._flights.get(p.job_id)) is not None:
                    flight.result.written(p)

    def release(self, job_id: str) -> Flight:
        with self._lock:
            return self._flights.pop(job_id)

    def release_all(self) -> list[Flight]:
        with self._lock:
            flights = list(self._flights.values())
            self._flights.clear()
            return flights


def _due(flight: Flight, progress: bool, lines: bool) -> bool:
    return flight.final is not None or (progress and (lines or not flight.job.in_batch))
