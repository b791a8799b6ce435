"""The worker's SQL: claim a job, write its progress and result, heartbeat, and find orphans.

Every write to a job is conditional on the attempt that claimed it, so a stale duplicate run (a
redelivered message, a worker presumed dead) can never overwrite what the current run wrote.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Insert, bindparam, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from core.choices import TokenLogprob
from core.models import FRESH_RESULTS, Job, TokenTimes, Worker, storable, utcnow
from core.states import JobStatus
from core.webhooks import Outbox


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    attempt: int
    prompt_token_ids: list[int]
    params: dict[str, Any]
    priority: int
    in_batch: bool  # a batch's jobs are not streamed live: their output is read from the files


@dataclass
class Progress:
    """What a run has produced so far; ``status`` is set once it is final. Choices and logprobs are in
    their stored form (core/choices.py); the token times are the new ones, from index ``token_times_from``."""

    job_id: str
    attempt: int
    output_text: str = ""
    completion_tokens: int = 0
    cached_tokens: int = 0
    token_times_ms: list[float] = field(default_factory=list)
    token_times_from: int = 0
    choices: list[dict[str, Any]] | None = None  # every sample when a job asked for more than one
    token_logprobs: list[list[TokenLogprob]] | None = None  # with the final result, when asked for
    started_at: datetime | None = None
    first_token_at: datetime | None = None
    status: JobStatus | None = None
    finish_reason: str | None = None
    error: str | None = None

    def columns(self) -> dict[str, Any]:
        values = {
            "output_text": storable(self.output_text),
            "choices": [c | {"text": storable(c["text"])} for c in self.choices] if self.choices else None,
            "token_logprobs": self.token_logprobs,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "started_at": self.started_at,
            "first_token_at": self.first_token_at,
        }
        if self.status is not None:
            values |= {
                "status": self.status,
                "finish_reason": self.finish_reason,
                "error": self.error,
                "finished_at": utcnow(),
            }
        return values

    def token_times(self) -> dict[str, Any]:
        """The row of its new token times (``job_token_times``)."""
        times = {"first": self.token_times_from, "times_ms": self.token_times_ms}
        return {"job_id": self.job_id, "attempt": self.attempt} | times


# A run's write, bound per row: the SET clause is the parameters' other keys (one executemany per key set).
RUN_WRITE = update(Job.__table__).where(
    Job.__table__.c.id == bindparam("run_id"),
    Job.__table__.c.attempt == bindparam("run_attempt"),
    Job.__table__.c.status == JobStatus.RUNNING,
)


def append_token_times(dialect: str) -> Insert:
    """A chunk of new token times; the same chunk again (a retry after an unknown outcome) replaces it."""
    statement = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(TokenTimes)
    return statement.on_conflict_do_update(
        index_elements=["job_id", "attempt", "first"], set_={"times_ms": statement.excluded.times_ms}
    )


@dataclass
class JobStore:
    sessions: sessionmaker[Session]
    model: str
    outbox: Outbox | None = None  # where a job's end is recorded as webhook events; None: nowhere

    def claim(self, job_id: str, worker_id: str) -> ClaimedJob | None:
        """Take a queued job for a new attempt; None when it is not queued (done, cancelled, taken)."""
        statement = (
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.cancel_requested.is_(False))
            .values(status=JobStatus.RUNNING, attempt=Job.attempt + 1, worker_id=worker_id, **FRESH_RESULTS)
            .returning(Job.attempt, Job.prompt_token_ids, Job.params, Job.priority, Job.batch_id.is_not(None))
        )
        with self.sessions.begin() as session:
            row = session.execute(statement).one_or_none()
            if row is not None:  # an earlier run's token times: no reader sees them any more
                session.execute(delete(TokenTimes).where(TokenTimes.job_id == job_id))
        return None if row is None else ClaimedJob(job_id, *row)

    def write(self, progress: list[Progress]) -> set[str]:
        """Write progress (and results) of the runs this worker owns; returns the ids it no longer owns.

        A row the database refuses (bad data, not a lost connection) fails that job alone, with the reason.
        """
        try:
            with self.sessions.begin() as session:
                lost = self._write_many(session, progress)
                ended = [p.job_id for p in progress if p.status is not None and p.job_id not in lost]
                deliveries = self._record_events(session, ended)
        except DBAPIError as error:
            if isinstance(error, OperationalError) or error.connection_invalidated or len(progress) == 1:
                raise
            return set().union(*(self._write_alone(p) for p in progress))
        self._publish(deliveries)
        return lost

    def _write_alone(self, p: Progress) -> set[str]:
        try:
            return self.write([p])
        except DBAPIError as error:
            if isinstance(error, OperationalError) or error.connection_invalidated:
                raise
            failure = FRESH_RESULTS | {"status": JobStatus.FAILED, "finished_at": utcnow()}
            failure["error"] = f"the result could not be stored: {error.orig!r}"[:2000]
            with self.sessions.begin() as session:
                if not self._write_one(session, p.job_id, p.attempt, failure):
                    return {p.job_id}
                deliveries = self._record_events(session, [p.job_id])
            self._publish(deliveries)
            return set()

    def _write_many(self, session: Session, progress: list[Progress]) -> set[str]:
        """One executemany per set of columns (progress, results): a single round trip each. Only when
        fewer rows matched than were written are the runs checked one by one for the lost ones."""
        by_columns: dict[tuple[str, ...], list[tuple[Progress, dict[str, Any]]]] = defaultdict(list)
        for p in progress:
            values = p.columns()
            by_columns[tuple(values)].append((p, values))
        lost: set[str] = set()
        for rows in by_columns.values():
            params = [{"run_id": p.job_id, "run_attempt": p.attempt, **values} for p, values in rows]
            if session.connection().execute(RUN_WRITE, params).rowcount != len(rows):
                lost |= {
                    p.job_id
                    for p, values in rows
                    if not self._write_one(session, p.job_id, p.attempt, values)
                }
        chunks = [p.token_times() for p in progress if p.token_times_ms and p.job_id not in lost]
        if chunks:  # appended: a flush writes the new times only
            connection = session.connection()
            connection.execute(append_token_times(connection.dialect.name), chunks)
        return lost

    @staticmethod
    def _write_one(session: Session, job_id: str, attempt: int, values: dict[str, Any]) -> bool:
        statement = (
            update(Job)
            .where(Job.id == job_id, Job.attempt == attempt, Job.status == JobStatus.RUNNING)
            .values(**values)
        )
        return session.execute(statement).rowcount == 1

    def _record_events(self, session: Session, ended: list[str]) -> list[str]:
        """Webhook deliveries for jobs that just ended, in the transaction that ended them."""
        if self.outbox is None or not ended:
            return []
        jobs = session.scalars(select(Job).where(Job.id.in_(ended)))
        return [d for job in jobs for d in self.outbox.record(session, f"job.{job.status}", job=job)]

    def _publish(self, deliveries: list[str]) -> None:
        """After the commit: a publish that fails is logged; the webhook sender's sweeper repairs it."""
        if self.outbox is not None and deliveries:
            self.outbox.publish(deliveries)

    def requeue(self, job_id: str, attempt: int) -> int | None:
        """Give a run back to the queue; returns the job's priority, or None if the run is not ours."""
        statement = (
            update(Job)
            .where(Job.id == job_id, Job.attempt == attempt, Job.status == JobStatus.RUNNING)
            .values(status=JobStatus.QUEUED, worker_id=None, published_at=utcnow())
            .returning(Job.priority)
        )
        with self.sessions.begin() as session:
            return session.execute(statement).scalar_one_or_none()

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        with self.sessions() as session:
            query = select(Job.id).where(Job.id.in_(job_ids), Job.cancel_requested.is_(True))
            return set(session.scalars(query))

    # --- liveness ---

    def heartbeat(self, worker_id: str, stats: dict[str, float]) -> None:
        now = utcnow()
        with self.sessions.begin() as session:
            found = session.execute(
                update(Worker).where(Worker.id == worker_id).values(heartbeat_at=now, stats=stats)
            ).rowcount
            if not found:
                session.add(Worker(id=worker_id, model=self.model, heartbeat_at=now, stats=stats))

    def remove_worker(self, worker_id: str) -> None:
        with self.sessions.begin() as session:
            session.execute(delete(Worker).where(Worker.id == worker_id))

    # --- reconciliation ---

    def requeue_orphans(self, heartbeat_timeout: float) -> list[tuple[str, int]]:
        """Running jobs whose worker stopped heartbeating go back to the queue (or end, if cancelled)."""
        now = utcnow()
        live = select(Worker.id).where(Worker.heartbeat_at > now - timedelta(seconds=heartbeat_timeout))
        orphaned = (Job.model == self.model, Job.status == JobStatus.RUNNING, Job.worker_id.not_in(live))
        with self.sessions.begin() as session:
            cancelled = session.scalars(
                update(Job)
                .where(*orphaned, Job.cancel_requested.is_(True))
                .values(status=JobStatus.CANCELLED, finished_at=now, finish_reason="abort")
                .returning(Job.id)
            ).all()
            deliveries = self._record_events(session, list(cancelled))
            rows = session.execute(
                update(Job)
                .where(*orphaned)
                .values(status=JobStatus.QUEUED, worker_id=None, published_at=now)
                .returning(Job.id, Job.priority)
            ).all()
            session.execute(delete(Worker).where(Worker.heartbeat_at < now - timedelta(days=1)))
        self._publish(deliveries)
        return [(job_id, priority) for job_id, priority in rows]

    def republish_due(self, older_than: float) -> list[tuple[str, int]]:
        """Queued jobs last published over ``older_than`` seconds ago: stamp them and return them."""
        now = utcnow()
        statement = (
            update(Job)
            .where(
                Job.model == self.model,
                Job.status == JobStatus.QUEUED,
                or_(Job.published_at.is_(None), Job.published_at < now - timedelta(seconds=older_than)),
            )
            .values(published_at=now)
            .returning(Job.id, Job.priority)
        )
        with self.sessions.begin() as session:
            return [(job_id, priority) for job_id, priority in session.execute(statement).all()]
