"""The worker's SQL: claim a job, write its progress and result, heartbeat, and find orphans.

Every write to a job is conditional on the attempt that claimed it, so a stale duplicate run (a
redelivered message, a worker presumed dead) can never overwrite what the current run wrote.
"""

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    CompoundSelect,
    Connection,
    Select,
    String,
    Update,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    literal,
    not_,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from core.choices import TokenLogprob
from core.db import autocommitting
from core.models import FRESH_RESULTS, Job, JSONType, TokenTimes, Worker, storable, utcnow
from core.states import JobStatus
from core.timings import joined
from core.webhooks import Outbox
from worker.fair import QUEUED, RUNNING, SKIP, Prefixes, Submitted, fairest, skipping
from worker.run_writes import APPEND_TEXT, append_token_times, update_runs

logger = logging.getLogger(__name__)


def database_away(error: BaseException) -> bool:
    """The database did not answer (down, restarting, connection lost, SQLite's file busy): try again
    later, unchanged. SQLite raises OperationalError for a bad statement too (SQLITE_ERROR: no such
    function, no such table): that is a bug to log, not an outage to wait out."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if not isinstance(error, OperationalError):
        return False
    return getattr(error.orig, "sqlite_errorname", None) != "SQLITE_ERROR"


@dataclass(frozen=True)
class Resume:
    """What an earlier run of a job flushed, which its new run goes on from rather than starting over:
    the first choice's token ids and their times, its text, and when the job started and first produced."""

    token_ids: list[int]
    times_ms: list[float]
    text: str
    started_at: datetime
    first_token_at: datetime | None


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    attempt: int
    prompt_token_ids: list[int]
    params: dict[str, Any]
    priority: int
    in_batch: bool  # a batch's jobs are not streamed live: their output is read from the files
    resume: Resume | None = None  # None: it starts from its first token
    prefix_key: int | None = None  # contract/prefix.py


def _claimed(job_id: str, row: Sequence[Any], resume: Resume | None = None) -> ClaimedJob:
    """The job a claim's UPDATE returned (``CLAIM``'s first six columns)."""
    attempt, prompt, params, priority, in_batch, prefix_key = row[:6]
    return ClaimedJob(job_id, attempt, prompt, params, priority, in_batch, resume, prefix_key)


def resumable(params: dict[str, Any]) -> bool:
    """Whether a run can go on from an earlier one's tokens: one sample, no beams, no logprobs (the
    engine's ``continue_from``); the others start over."""
    one = params.get("n", 1) == 1 and not params.get("use_beam_search")
    return one and params.get("logprobs") is None


# What a claim keeps of an earlier run until it knows whether the new run resumes it.
KEPT_ON_CLAIM = ("output_text", "started_at", "first_token_at", "completion_tokens")


@dataclass
class Progress:
    """What a run has produced so far; ``status`` is set once it is final. Choices and logprobs are in
    their stored form (core/choices.py); the token times are the new ones, from index ``token_times_from``."""

    job_id: str
    attempt: int
    output_text: str = ""  # the first choice's text from character ``text_from`` on: only what is new
    completion_tokens: int = 0
    cached_tokens: int = 0
    engine_ms: float = 0.0
    token_times_ms: list[float] = field(default_factory=list)
    token_times_from: int = 0
    token_ids: list[int] | None = None  # the first choice's, at the times' indexes; None: beam search
    output_token_ids: list[list[int]] | None = None  # every choice's, with the final result
    text_from: int = 0
    choices: list[dict[str, Any]] | None = None  # every sample when a job asked for more than one
    token_logprobs: list[list[TokenLogprob]] | None = None  # with the final result, when asked for
    started_at: datetime | None = None
    first_token_at: datetime | None = None
    status: JobStatus | None = None
    finish_reason: str | None = None
    error: str | None = None
    embeddings: bytes | None = None  # an embedding job's vectors (core/embeddings.py), with its result

    def columns(self) -> dict[str, Any]:
        values = {
            "choices": [c | {"text": storable(c["text"])} for c in self.choices] if self.choices else None,
            "token_logprobs": self.token_logprobs,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "engine_ms": self.engine_ms,
            "started_at": self.started_at,
            "first_token_at": self.first_token_at,
        }
        if self.status is not None:
            values |= {
                "status": self.status,
                "finish_reason": self.finish_reason,
                "error": self.error,
                "finished_at": utcnow(),
                "output_token_ids": self.output_token_ids,
            }
        if self.embeddings is not None:
            values["embeddings"] = self.embeddings
        return values

    def text(self) -> dict[str, Any]:
        """The parameters of ``APPEND_TEXT``: the stored text is cut to ``text_from`` characters, then the
        new piece follows (so a retry after an unknown outcome, or a rerun's first flush, writes the same)."""
        return {"text_from": self.text_from, "text_piece": storable(self.output_text)}

    def token_times(self) -> dict[str, Any]:
        """The row of its new token times (``job_token_times``)."""
        times = {"first": self.token_times_from, "times_ms": self.token_times_ms, "token_ids": self.token_ids}
        return {"job_id": self.job_id, "attempt": self.attempt} | times


JOBS = Job.__table__
# A claim's UPDATE, but for its WHERE and the worker's values: a new attempt with fresh results, but for
# those a resumed run keeps (``KEPT_ON_CLAIM``). A first attempt (attempt 0 before) records its run here.
FIRST_RUN = [{"attempt": 1, "resumed_from_token": 0}]
CLAIM = (
    update(JOBS)
    .values(
        status=JobStatus.RUNNING,
        attempt=JOBS.c.attempt + 1,
        runs=case((JOBS.c.attempt == 0, literal(FIRST_RUN, JOBS.c.runs.type)), else_=JOBS.c.runs),
        **{key: value for key, value in FRESH_RESULTS.items() if key not in KEPT_ON_CLAIM},
    )
    .returning(
        JOBS.c.attempt,
        JOBS.c.prompt_token_ids,
        JOBS.c.params,
        JOBS.c.priority,
        JOBS.c.batch_id.is_not(None),
        JOBS.c.prefix_key,
        *(JOBS.c[key] for key in KEPT_ON_CLAIM),
        JOBS.c.runs,
    )
)


@cache
def claim_statement(retry: bool, first: bool) -> Update:
    """The claim's UPDATE of a job (``claimed_row`` binds it): a queued job not asked to cancel (``retry``:
    or a run of this worker's); ``first``: only for its first run. Built once per shape: made and keyed
    for SQLAlchemy's cache anew for each claim, it cost more CPU than its round trip."""
    worker_id = bindparam("claim_worker", type_=JOBS.c.worker_id.type)
    claimable = QUEUED
    if retry:
        claimable = or_(claimable, and_(RUNNING, JOBS.c.worker_id == worker_id))
    job_id = bindparam("claim_id", type_=JOBS.c.id.type)
    where = [JOBS.c.id == job_id, claimable, JOBS.c.cancel_requested.is_(False)]
    if first:
        where.append(JOBS.c.attempt == 0)
    served_by = bindparam("claim_served_by", type_=JOBS.c.served_by.type)
    return CLAIM.where(*where).values(worker_id=worker_id, served_by=served_by)


def claimed_row(
    connection: Connection, job_id: str, worker_id: str, served_by: Any, retry: bool, first: bool = False
) -> Row[Any] | None:
    """``claim_statement``'s row for ``job_id`` claimed by ``worker_id``; None when it was not claimable."""
    bound = claiming(job_id, worker_id, served_by)
    return connection.execute(claim_statement(retry, first), bound).one_or_none()


def claiming(job_id: str, worker_id: str, served_by: Any) -> dict[str, Any]:
    """The parameters of ``claim_statement`` (and of ``picked_and_claimed``)."""
    return {"claim_id": job_id, "claim_worker": worker_id, "claim_served_by": served_by}


@cache
def picked_and_claimed(model: str, aging: float, prefix_aware: bool) -> Select[Any]:
    """PostgreSQL: ``fairest``, and in the same statement (a data-modifying CTE) the first run's claim of
    the ticket's own job (``claim_id``) when that is the fairest and step 5 has nothing to choose among:
    ``fairest``'s columns, then the claim's (the last ``CLAIMED``; NULL when it did not claim)."""
    best = fairest(model, aging, "postgresql").cte("best")
    chosen = select(best.c.id)
    if prefix_aware:
        chosen = chosen.where(not_(best.c.shared))
    claimed = claim_statement(retry=False, first=True).where(JOBS.c.id.in_(chosen)).cte("claimed")
    return select(best, claimed).select_from(best.outerjoin(claimed, true()))


CLAIMED = len(CLAIM.returning_column_descriptions)  # the last columns of ``picked_and_claimed``'s row


@cache
def prefix_holders(model: str) -> CompoundSelect:
    """One read for step 5's ``Prefixes``: the prefix keys of the jobs of ``model`` running or in ``skip``
    (bound), each once with ``here`` (run by this worker or in ``skip``) and once without, then each other
    worker's published keys (``worker_id`` bound: this one's)."""
    here = or_(Job.worker_id == bindparam("worker_id"), Job.id.in_(SKIP))
    running = select(Job.prefix_key, here.label("here"), cast(null(), JSONType).label("published"))
    # Not every row this worker ran: its ended jobs are its history, which grows (its cache is ``cached``).
    running = running.where(Job.model == model, or_(RUNNING, Job.id.in_(SKIP)))
    # Each key once: a batch's running lines share a few keys, and a row per running job (256 at a
    # time) was most of a claim's time in Python (bench/RESULTS.md, 2026-11-28).
    running = running.where(Job.prefix_key.is_not(None)).distinct()
    others = Worker.model == model, Worker.id != bindparam("worker_id")
    published = select(cast(null(), BigInteger), false(), Worker.prefix_keys).where(*others)
    return union_all(running, published)


def prefixes_held(
    connection: Connection, model: str, skip: set[str], worker_id: str, cached: frozenset[int]
) -> Prefixes:
    """Held here: this worker's runs' prefix keys and its engine's cache (``cached``); held elsewhere: the
    other workers' runs' and what their heartbeats published."""
    mine, others = set(cached), set()
    for key, here, published in connection.execute(
        prefix_holders(model), skipping(skip) | {"worker_id": worker_id}
    ):
        (mine if here else others).add(key)
        others.update(published or ())
    return Prefixes(frozenset(mine - {None}), frozenset(others - mine - {None}))


def resumed_run(
    session: Session, job_id: str, attempt: int, params: dict[str, Any], kept: dict[str, Any]
) -> Resume | None:
    """The earlier run's flushed tokens, their chunks handed to the new run; None (its chunks deleted:
    no reader sees them any more) when the new run starts over."""
    previous = (TokenTimes.job_id == job_id, TokenTimes.attempt == attempt - 1)
    chunks = []
    if resumable(params) and attempt > 1 and kept["started_at"] is not None:
        query = select(TokenTimes.first, TokenTimes.times_ms, TokenTimes.token_ids).where(*previous)
        chunks = session.execute(query.order_by(TokenTimes.first)).all()
    if not chunks or any(chunk.token_ids is None for chunk in chunks):
        session.execute(delete(TokenTimes).where(TokenTimes.job_id == job_id))
        return None
    session.execute(delete(TokenTimes).where(TokenTimes.job_id == job_id, TokenTimes.attempt != attempt - 1))
    session.execute(update(TokenTimes).where(*previous).values(attempt=attempt))
    return Resume(
        token_ids=joined((chunk.first, chunk.token_ids) for chunk in chunks),
        times_ms=joined((chunk.first, chunk.times_ms) for chunk in chunks),
        text=kept["output_text"],
        started_at=kept["started_at"],
        first_token_at=kept["first_token_at"],
    )


def waiting_since(model: str, published_before: datetime) -> tuple[Any, ...]:
    """Where-clauses of ``model``'s queued jobs last published before ``published_before`` (or never)."""
    published = or_(Job.published_at.is_(None), Job.published_at < published_before)
    return (Job.model == model, Job.status == JobStatus.QUEUED, published)


def _preferred(connection: Connection, rows: Submitted, best: Row[Any], prefixes: Prefixes) -> str:
    """Fair share's step 5 among ``rows``, whose first (by id) is ``best``."""
    if best.prefix_key in prefixes.mine:
        return best.id  # type: ignore[no-any-return]
    if prefixes.mine and (mine := rows.first_mine(connection, prefixes)) is not None:
        return mine
    if best.prefix_key is None or best.prefix_key not in prefixes.others:
        return best.id  # type: ignore[no-any-return]
    return rows.first_free(connection, prefixes) or best.id


@dataclass
class JobStore:
    sessions: sessionmaker[Session]
    model: str
    outbox: Outbox | None = None  # where a job's end is recorded as webhook events; None: nowhere
    max_attempts: int = 3  # runs a job may start; when the last one is abandoned too, the job fails
    fair_aging: float | None = None  # fair share's aging (worker/fair.py); None: a message claims its own job
    served_by: dict[str, Any] | None = None  # what serves its jobs (worker/engine's identity), stored per run
    prefix_aware: bool = False  # fair share's step 5 (worker/fair.py): runs holding a prompt's prefix first
    held_prefixes: Callable[[], frozenset[int]] = frozenset  # the prefix keys this worker's engine holds
    # One pick at a time in this worker: picks at once found the same fairest job, and all but one of them
    # picked again (2.8 picks a claim when 256 tickets came at once), each a costly statement.
    _picks: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def fair(self) -> bool:
        return self.fair_aging is not None

    def pick(self, job_id: str, skip: set[str], worker_id: str = "") -> str | None:
        """The job that the message for ``job_id`` claims: with fair share, the fairest queued job of the
        model but those in ``skip`` (being claimed or run here), or None when there is none (the message is
        a spare ticket); without, its own. Jobs being claimed count as their key's running ones, so threads
        claiming at once share too. With prefix-aware order, among the rows submitted with the fairest
        job: one whose prefix this worker holds, else one that no other worker holds (``worker_id``: this
        worker's row, whose published keys are not another's); a job submitted alone (most that are not a
        batch's lines) has none, and its pick reads no prefixes."""
        if self.fair_aging is None:
            return job_id
        with self.sessions() as session, self._picks:
            return self._pick(autocommitting(session), skip, worker_id)[0]

    def take(
        self,
        job_id: str,
        passed_over: Callable[[], set[str]],
        worker_id: str,
        reserve: Callable[[str], bool],
        release: Callable[[str], None],
    ) -> tuple[str | None, ClaimedJob | None]:
        """``pick`` (passing over what ``passed_over`` says as the pick starts) and ``claim`` on one
        connection (a claim's round trips are its cost, not its rows): returns the job picked, and the job
        claimed once ``reserve`` (the caller's mark that it is being claimed here; ``release`` takes one
        back) accepted the pick; None when it did not, or when the job was not queued any more. The pick
        and its mark are made one at a time; the claims go on side by side. The pick only reads, and a
        job's first run is claimed by one UPDATE, so both run in autocommit (no BEGIN or COMMIT round
        trip); a later run, which finds what it resumes, is claimed in a transaction. On PostgreSQL with
        fair share the ticket's own job is marked first, and the pick's statement claims it when it is the
        pick (a job submitted alone: one statement from its message to its run)."""
        with self.sessions() as session:
            with self._picks:
                # Without fair share, the claim is the first to reach the database.
                picked, marked = job_id, None
                if self.fair:
                    connection, skip = autocommitting(session), passed_over()
                    in_one = connection.dialect.name == "postgresql" and job_id not in skip
                    marked = job_id if in_one and reserve(job_id) else None
                    picked, row = self._pick(connection, skip, worker_id, own=marked)
                    if row is not None:
                        return picked, _claimed(picked, row)
                if marked is not None and picked != marked:
                    release(marked)
                    marked = None
                if picked is None or (marked is None and not reserve(picked)):
                    return picked, None
            connection = autocommitting(session)
            row = claimed_row(connection, picked, worker_id, self.served_by, retry=False, first=True)
            if row is not None:
                return picked, _claimed(picked, row)
        return picked, self.claim(picked, worker_id)  # a later run, or not queued any more

    def _pick(
        self, connection: Connection, skip: set[str], worker_id: str, own: str | None = None
    ) -> tuple[str | None, Sequence[Any] | None]:
        """The fairest job, and None; with ``own`` (the ticket's job, marked by the caller; PostgreSQL), when
        the same statement claimed it (``picked_and_claimed``): ``own`` and its claim's columns."""
        assert self.fair_aging is not None
        dialect = connection.dialect.name
        statement, bound = fairest(self.model, self.fair_aging, dialect), skipping(skip)
        if own is not None:
            statement = picked_and_claimed(self.model, self.fair_aging, self.prefix_aware)
            bound |= claiming(own, worker_id, self.served_by)
        best = connection.execute(statement, bound).one_or_none()
        if best is not None and own is not None and best[-CLAIMED] is not None:  # its attempt
            return own, best[-CLAIMED:]
        if best is None or not self.prefix_aware or not best.shared:  # step 5 has nothing to choose among
            return None if best is None else best.id, None
        submission = best.key_id, best.priority, best.deadline_at, best.queued_at
        submitted = Submitted(self.model, skip, *submission, dialect)
        held = prefixes_held(connection, self.model, skip, worker_id, self.held_prefixes())
        return _preferred(connection, submitted, best, held), None

    def claim(self, job_id: str, worker_id: str, retry: bool = False) -> ClaimedJob | None:
        """Take a queued job for a new attempt; None when it is not queued (done, cancelled, taken).

        ``retry``: a try of this worker failed, and its commit may have landed with the answer lost, so a
        run of this worker's is taken over too (the caller holds no run of the job).
        """
        with self.sessions.begin() as session:
            return self._claim(session, job_id, worker_id, retry)

    def _claim(self, session: Session, job_id: str, worker_id: str, retry: bool) -> ClaimedJob | None:
        """A job's first run (attempt 0 before: nothing to resume, its results still fresh) is one
        UPDATE, its ``runs`` written there; a later run then finds what it resumes, and records it."""
        row = claimed_row(session.connection(), job_id, worker_id, self.served_by, retry)
        if row is None:
            return None
        attempt, params, (*kept, runs) = row[0], row[2], row[6:]
        if attempt == 1:
            return _claimed(job_id, row)
        resume = resumed_run(session, job_id, attempt, params, dict(zip(KEPT_ON_CLAIM, kept, strict=True)))
        start = {"attempt": attempt, "resumed_from_token": len(resume.token_ids) if resume else 0}
        restart = {} if resume else {key: FRESH_RESULTS[key] for key in KEPT_ON_CLAIM}
        appended = JOBS.update().where(JOBS.c.id == job_id).values(runs=[*(runs or []), start], **restart)
        session.execute(appended)
        return _claimed(job_id, row, resume)

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
            if database_away(error) or len(progress) == 1:
                raise
            return set().union(*(self._write_alone(p) for p in progress))
        self._publish(deliveries)
        return lost

    def _write_alone(self, p: Progress) -> set[str]:
        try:
            return self.write([p])
        except DBAPIError as error:
            if database_away(error):
                raise
            failure = FRESH_RESULTS | {"status": JobStatus.FAILED, "finished_at": utcnow()}
            failure["error"] = f"the result could not be stored: {error.orig!r}"[:2000]
            with self.sessions.begin() as session:
                if not self._write_one(session, p.job_id, p.attempt, failure, text=None):
                    return {p.job_id}
                deliveries = self._record_events(session, [p.job_id])
            self._publish(deliveries)
            return set()

    def _write_many(self, session: Session, progress: list[Progress]) -> set[str]:
        """One statement per set of columns (progress, results) for all runs (worker/run_writes.py); the
        runs it did not write are checked one by one for the lost ones."""
        by_columns: dict[tuple[str, ...], list[tuple[Progress, dict[str, Any]]]] = defaultdict(list)
        for p in progress:
            values = p.columns()
            by_columns[tuple(values)].append((p, values))
        lost: set[str] = set()
        for keys, rows in by_columns.items():
            params = [
                {"run_id": p.job_id, "run_attempt": p.attempt, **p.text(), **values} for p, values in rows
            ]
            written = update_runs(session.connection(), keys, params)
            lost |= {
                p.job_id
                for p, values in rows
                if p.job_id not in written
                and not self._write_one(session, p.job_id, p.attempt, values, p.text())
            }
        chunks = [p.token_times() for p in progress if p.token_times_ms and p.job_id not in lost]
        if chunks:  # appended: a flush writes the new times only
            append_token_times(session.connection(), chunks)
        return lost

    @staticmethod
    def _write_one(
        session: Session, job_id: str, attempt: int, values: dict[str, Any], text: dict[str, Any] | None
    ) -> bool:
        """``text``: the parameters of the text's append (``Progress.text``); None: ``values`` set it."""
        # Still running, or already in the status these values set: the statement that sent us here
        # may have applied them, and a run it ended is not lost (its final token times must follow).
        ours = {JobStatus.RUNNING, values.get("status", JobStatus.RUNNING)}
        appended = {} if text is None else {"output_text": APPEND_TEXT}
        statement = (
            update(Job)
            .where(Job.id == job_id, Job.attempt == attempt, Job.status.in_(ours))
            .values(**values, **appended)
        )
        return session.execute(statement, text or {}).rowcount == 1

    def _record_events(self, session: Session, ended: list[str]) -> list[str]:
        """Webhook deliveries for jobs that just ended, in the transaction that ended them."""
        if self.outbox is None or not ended:
            return []
        jobs = session.scalars(select(Job).where(Job.id.in_(ended), *self.outbox.jobs_heard()))
        return [d for job in jobs for d in self.outbox.record(session, f"job.{job.status}", job=job)]

    def _publish(self, deliveries: list[str]) -> None:
        """After the commit: a publish that fails is logged; the webhook sender's sweeper repairs it."""
        if self.outbox is not None and deliveries:
            self.outbox.publish(deliveries)

    def requeue(self, job_id: str, attempt: int) -> int | None:
        """Give a run back to the queue; returns the job's priority, or None if the run is not ours or was
        the job's last allowed attempt (then the job has failed, abandoned)."""
        ours = (Job.id == job_id, Job.attempt == attempt, Job.status == JobStatus.RUNNING)
        with self.sessions.begin() as session:
            deliveries = self._fail_abandoned(session, ours, utcnow())
            priority = session.execute(
                update(Job)
                .where(*ours)
                .values(status=JobStatus.QUEUED, worker_id=None, published_at=utcnow())
                .returning(Job.priority)
            ).scalar_one_or_none()
        self._publish(deliveries)
        return priority

    def _fail_abandoned(self, session: Session, running: tuple[Any, ...], now: datetime) -> list[str]:
        """Fail the ``running`` runs that were their job's last allowed attempt, rather than requeue them:
        a job that kills every worker that runs it must not loop forever. Returns their webhook deliveries."""
        error = (
            literal("abandoned by ")
            + cast(Job.attempt, String)
            + literal(
                f" workers (PAGEDQ_MAX_ATTEMPTS={self.max_attempts}): every run ended without a result, as "
                "when the job crashes or hangs its worker"
            )
        )
        failed = session.scalars(
            update(Job)
            .where(*running, Job.attempt >= self.max_attempts)
            .values(status=JobStatus.FAILED, finished_at=now, worker_id=None, error=error)
            .returning(Job.id)
        ).all()
        return self._record_events(session, list(failed))

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        with self.sessions.begin() as session:
            query = select(Job.id).where(Job.id.in_(job_ids), Job.cancel_requested.is_(True))
            return set(session.scalars(query))

    # --- liveness ---

    def heartbeat(
        self,
        worker_id: str,
        stats: dict[str, float],
        prefix_keys: Collection[int] = (),
        weights: dict[str, Any] | None = None,
        process: str | None = None,
    ) -> None:
        """Registers or refreshes the worker's row; ``weights`` (its engine's, fixed at load) and ``process``
        (worker/liveness.py) every time, so that a row made again after it aged out has them too."""
        now, keys = utcnow(), sorted(prefix_keys)
        with self.sessions.begin() as session:
            beat = {
                "heartbeat_at": now,
                "stats": stats,
                "prefix_keys": keys,
                "weights": weights,
                "process": process,
            }
            found = session.execute(update(Worker).where(Worker.id == worker_id).values(**beat)).rowcount
            if not found:
                session.add(Worker(id=worker_id, model=self.model, **beat))

    def remove_worker(self, worker_id: str) -> None:
        with self.sessions.begin() as session:
            session.execute(delete(Worker).where(Worker.id == worker_id))

    # --- reconciliation ---

    def requeue_orphans(
        self, heartbeat_timeout: float | None, proven_dead: Callable[[str], bool] = lambda process: False
    ) -> list[tuple[str, int]]:
        """Running jobs whose worker stopped heartbeating (None: judge no heartbeat) or is proven dead by
        its ``workers.process`` (worker/liveness.py) go back to the queue (or end: cancelled if asked to,
        failed if that was their last allowed attempt). The dead leave the workers table."""
        known = select(Worker.id, Worker.process).where(
            Worker.model == self.model, Worker.process.is_not(None)
        )
        with self.sessions.begin() as session:
            dead = [worker for worker, process in session.execute(known) if proven_dead(process)]
        if dead:
            logger.warning("workers proven dead on this host", extra={"workers": dead})
        if heartbeat_timeout is None and not dead:
            return []
        now = utcnow()
        gone = Job.worker_id.in_(dead)
        if heartbeat_timeout is not None:
            gone = or_(gone, Job.worker_id.not_in(select(Worker.id).where(Worker.alive(heartbeat_timeout))))
        orphaned = (Job.model == self.model, Job.status == JobStatus.RUNNING, gone)
        with self.sessions.begin() as session:
            cancelled = session.scalars(
                update(Job)
                .where(*orphaned, Job.cancel_requested.is_(True))
                .values(status=JobStatus.CANCELLED, finished_at=now, finish_reason="abort")
                .returning(Job.id)
            ).all()
            deliveries = self._record_events(session, list(cancelled))
            deliveries += self._fail_abandoned(session, orphaned, now)
            rows = session.execute(
                update(Job)
                .where(*orphaned)
                .values(status=JobStatus.QUEUED, worker_id=None, published_at=now)
                .returning(Job.id, Job.priority)
            ).all()
            session.execute(
                delete(Worker).where(or_(Worker.heartbeat_at < now - timedelta(days=1), Worker.id.in_(dead)))
            )
        self._publish(deliveries)
        return [(job_id, priority) for job_id, priority in rows]

    def waiting_priorities(self, published_before: datetime) -> set[int]:
        """The priorities of queued jobs last published before ``published_before``."""
        with self.sessions.begin() as session:
            query = select(Job.priority).where(*waiting_since(self.model, published_before)).distinct()
            return set(session.scalars(query))

    def republish_due(self, published_before: datetime, priorities: tuple[int, int]) -> list[tuple[str, int]]:
        """Queued jobs with a priority in ``priorities`` (lowest, highest), last published before
        ``published_before``: stamp them published now and return them, to be published again."""
        statement = (
            update(Job)
            .where(*waiting_since(self.model, published_before), Job.priority.between(*priorities))
            .values(published_at=utcnow())
            .returning(Job.id, Job.priority)
        )
        with self.sessions.begin() as session:
            return [(job_id, priority) for job_id, priority in session.execute(statement).all()]
