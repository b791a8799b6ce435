"""The tables, as SQLAlchemy 2 typed models. Alembic (``migrations/``) owns their schema history."""

import os
import time
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    column,
    func,
    inspect,
    literal_column,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.sql import ColumnElement

from core.choices import TokenLogprob
from core.states import JobStatus
from core.timings import joined

JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every backend (SQLite drops the zone; this puts it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def storable(text: str) -> str:
    """PostgreSQL text cannot hold NUL: a model that emits one gets U+FFFD in its place, everywhere."""
    return text.replace("\x00", "\ufffd")


def utcnow() -> datetime:
    return datetime.now(UTC)


def time_ordered_id(prefix: str) -> str:
    """48 bits of milliseconds then 80 random bits, so id order is creation order."""
    return f"{prefix}{int(time.time() * 1000):012x}{os.urandom(10).hex()}"


def new_job_id() -> str:
    return time_ordered_id("job_")


def new_batch_id() -> str:
    return time_ordered_id("batch_")


def new_file_id() -> str:
    return time_ordered_id("file-")


def new_delivery_id() -> str:
    return time_ordered_id("msg_")


class Base(DeclarativeBase):
    pass


def new_key_id() -> str:
    return time_ordered_id("key_")


class ApiKey(Base):
    """An API key: only its sha256 is kept (``core/keys.py`` says why), with its first characters for
    display; its role, lifetime and per-key limits (NULL: the ``PAGEDQ_KEY_*`` default)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_key_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(8), default="user")  # admin | user
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    max_active_jobs: Mapped[int | None]
    requests_per_second: Mapped[float | None]
    tokens_per_minute: Mapped[int | None]
    max_tokens: Mapped[int | None]
    max_n: Mapped[int | None]
    max_prompt_tokens: Mapped[int | None]


def owner_column(index: bool = True) -> Mapped[str | None]:
    """The key that created the row (NULL: created with auth off); ``api/http/caller.py`` scopes reads by
    it."""
    return mapped_column(String(36), ForeignKey("api_keys.id"), index=index)


def lite_window(deadline: ColumnElement[Any], queued: ColumnElement[Any]) -> ColumnElement[Any]:
    """A queued job's completion window on SQLite (text datetimes), in whole milliseconds (its julian days
    hold milliseconds); -1: none. Literals, not bound parameters: ``ix_jobs_fair_heads_lite`` indexes it,
    and worker/fair.py's pick must write it the same to walk that index."""
    ms = func.round((func.julianday(deadline) - func.julianday(queued)) * literal_column("86400000"))
    return func.coalesce(ms, literal_column("-1"))


LITE_WINDOW = str(lite_window(column("deadline_at"), column("queued_at")).compile(dialect=sqlite.dialect()))
LITE_FAIR_HEADS = ("model", text("coalesce(key_id, '')"), "priority", text(LITE_WINDOW), "queued_at")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_job_id)
    key_id: Mapped[str | None] = owner_column(index=False)  # ix_jobs_key_id_status serves it
    status: Mapped[JobStatus] = mapped_column(String(16), default=JobStatus.QUEUED)
    model: Mapped[str] = mapped_column(String(200))
    priority: Mapped[int] = mapped_column(default=0)
    prompt: Mapped[str | None] = mapped_column(Text)
    messages: Mapped[list[dict[str, str]] | None] = mapped_column(JSONType)
    # An embedding job's (endpoint /v1/embeddings): one list of ids per input, cut to what is embedded.
    prompt_token_ids: Mapped[list[int] | list[list[int]]] = mapped_column(JSONType)
    # The engine's SamplingParams; an embedding job's: EmbeddingParams and the encoding_format.
    params: Mapped[dict[str, Any]] = mapped_column(JSONType)
    meta: Mapped[dict[str, str]] = mapped_column("metadata", JSONType, default=dict)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(JSONType)  # None: every job event
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))

    # A job that came from a line of a batch file: its batch, the line's custom_id, and its endpoint
    # (``/v1/chat/completions`` or ``/v1/completions``, which shapes the line's response body). An
    # embedding job's is ``/v1/embeddings``, online or not: it is what makes it one.
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id"))
    custom_id: Mapped[str | None] = mapped_column(String(512))
    endpoint: Mapped[str | None] = mapped_column(String(64))

    # Delivery: every claim by a worker bumps ``attempt``; writes are conditional on it.
    attempt: Mapped[int] = mapped_column(default=0)
    worker_id: Mapped[str | None] = mapped_column(String(120))
    cancel_requested: Mapped[bool] = mapped_column(default=False)

    # Results, written while running (partial) and once at the end; their stored form: core/choices.py.
    output_text: Mapped[str] = mapped_column(Text, default="")  # the first (or only) choice
    choices: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)  # all, when n > 1
    token_logprobs: Mapped[list[list[TokenLogprob]] | None] = mapped_column(JSONType)  # when asked for
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    cached_tokens: Mapped[int] = mapped_column(default=0)
    engine_ms: Mapped[float] = mapped_column(default=0.0)  # its share of engine steps (worker/engine)
    embeddings: Mapped[bytes | None] = mapped_column(LargeBinary)  # an embedding job's: core/embeddings.py
    # Reproducibility (GET /v1/jobs/{id}/manifest): each choice's output token ids, with the final result;
    # what served it (worker/engine's ``EngineIdentity``: digests, version, dtype, kernels); each run as
    # {"attempt", "resumed_from_token"} (0: started from scratch); the job this one replays.
    output_token_ids: Mapped[list[list[int]] | None] = mapped_column(JSONType)
    served_by: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    runs: Mapped[list[dict[str, int]] | None] = mapped_column(JSONType)
    replay_of: Mapped[str | None] = mapped_column(String(40))
    # The current run's per-token times, appended a chunk per flush; a new run starts with none.
    token_time_chunks: Mapped[list["TokenTimes"]] = relationship(
        primaryjoin="and_(Job.id == foreign(TokenTimes.job_id), Job.attempt == TokenTimes.attempt)",
        order_by="TokenTimes.first",
        viewonly=True,
        lazy="selectin",
    )

    # The job a replay replays (POST /v1/jobs/{id}/replay), to compare their tokens; None: gone or not one.
    original: Mapped["Job | None"] = relationship(
        primaryjoin="foreign(Job.replay_of) == remote(Job.id)", viewonly=True, lazy="selectin", join_depth=1
    )

    queued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # last handed to the broker
    # When it should be done (its batch's completion_window): among queued jobs of equal aged priority the
    # earliest deadline is claimed first (worker/fair.py); None: none, claimed after those that have one.
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Its prompt's leading blocks, hashed as the engine's prefix cache does (contract/prefix.py): jobs with
    # the same key share those blocks' KV, so a worker holding them claims them first (worker/fair.py).
    prefix_key: Mapped[int | None] = mapped_column(BigInteger)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # claimed by a worker: running from then
    first_token_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Deleted once past this and ended (core/retention.py); None: kept, or a batch's job (kept with it).
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_jobs_status_queued_at", "status", "queued_at"),
        Index("ix_jobs_expires_at", "expires_at"),
        Index("ix_jobs_worker_id", "worker_id"),
        Index("ix_jobs_batch_id_status", "batch_id", "status"),
        Index("ix_jobs_finished_at", "finished_at"),
        Index("ix_jobs_key_id_status", "key_id", "status"),
        # The claim's pick (worker/fair.py): queued jobs by owner, priority and window, each group's in order.
        Index(
            "ix_jobs_fair_heads",
            "model",
            text("coalesce(key_id, '')"),
            "priority",
            text("coalesce(deadline_at - queued_at, interval '-1 second')"),
            "queued_at",
            "id",
            postgresql_where=text("status = 'queued' AND NOT cancel_requested"),
        ).ddl_if(dialect="postgresql"),
        # Step 5's probe for a held prefix among a batch's queued lines (worker/fair.py).
        Index(
            "ix_jobs_queued_prefix",
            "prefix_key",
            "id",
            postgresql_where=text("status = 'queued' AND NOT cancel_requested AND prefix_key IS NOT NULL"),
        ).ddl_if(dialect="postgresql"),
        # Both on SQLite, whose window is worker/fair.lite_group's; step 5 probes a batch's lines by key.
        Index(
            "ix_jobs_fair_heads_lite",
            *LITE_FAIR_HEADS,
            "id",
            sqlite_where=text("status = 'queued' AND cancel_requested = 0"),
        ).ddl_if(dialect="sqlite"),
        Index(
            "ix_jobs_queued_prefix_lite",
            *LITE_FAIR_HEADS,
            "prefix_key",
            "id",
            sqlite_where=text("status = 'queued' AND cancel_requested = 0 AND prefix_key IS NOT NULL"),
        ).ddl_if(dialect="sqlite"),
        # A running job's row is rewritten at every flush: room left on its page keeps each new version
        # there (a HOT update: none of its ten indexes touched). Full pages moved 70% of them elsewhere.
        {"postgresql_with": {"fillfactor": 50}},
    )

    def insertable(self) -> dict[str, Any]:
        """This new job as a row of the table, by column name, its Python-side defaults applied to it
        first: what the table's Core ``insert()`` takes for many jobs at once, without the unit of work or
        the ORM's bulk insert (~200 and ~400 µs of CPU a job less; the object stays transient, and its
        readers see the id and defaults it was written with)."""
        values = {}
        for key, name, default in _column_defaults():
            value = getattr(self, key)
            if value is None and default is not None:
                value = default.arg(None) if default.is_callable else default.arg
                setattr(self, key, value)
            values[name] = value
        return values

    @property
    def token_times_ms(self) -> list[float]:
        """When each generated token (of the first choice) was produced, in ms since started_at."""
        if "token_time_chunks" in inspect(self).unloaded:  # a job just made here, never loaded: no run yet
            return []
        return joined((chunk.first, chunk.times_ms) for chunk in self.token_time_chunks)

    @property
    def choice_token_ids(self) -> list[list[int]]:
        """Each choice's output token ids: with the final result, else the first choice's flushed so far."""
        if self.output_token_ids is not None:
            return self.output_token_ids
        if "token_time_chunks" in inspect(self).unloaded:
            return []
        chunks = self.token_time_chunks
        if not chunks or any(chunk.token_ids is None for chunk in chunks):
            return []
        return [joined((chunk.first, chunk.token_ids or []) for chunk in chunks)]


# A run's results before it has produced any: a new job's, and what each claim resets them to.
FRESH_RESULTS: dict[str, Any] = {
    "output_text": "",
    "choices": None,
    "token_logprobs": None,
    "finish_reason": None,
    "error": None,
    "completion_tokens": 0,
    "cached_tokens": 0,
    "engine_ms": 0.0,
    "embeddings": None,
    "output_token_ids": None,
    "started_at": None,
    "first_token_at": None,
}


class TokenTimes(Base):
    """A chunk of a run's per-token times (ms since started_at), from the token at index ``first``:
    each flush appends one, so writing them costs what is new, never what was written before. Beside
    them, the first choice's token ids at the same indexes (None for beam search, whose tokens come at the
    end): a crashed run resumes from them."""

    __tablename__ = "job_token_times"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(primary_key=True)
    first: Mapped[int] = mapped_column(primary_key=True)
    times_ms: Mapped[list[float]] = mapped_column(JSONType)
    token_ids: Mapped[list[int] | None] = mapped_column(JSONType)


class Worker(Base):
    """A live worker: its heartbeat proves its running jobs are alive; its stats feed /metrics."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    stats: Mapped[dict[str, float]] = mapped_column(JSONType, default=dict)
    # The prefix keys (jobs.prefix_key) whose blocks its engine holds now, sent with each heartbeat.
    prefix_keys: Mapped[list[int] | None] = mapped_column(JSONType)
    # Its engine's weights as loaded (worker/engine/model/weights.py: types, bytes, kernels), for /v1/models.
    weights: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # Which process it is, where /proc can prove it dead (worker/liveness.py): boot/namespace/pid/start.
    process: Mapped[str | None] = mapped_column(String(120))

    @classmethod
    def alive(cls, heartbeat_timeout: float) -> ColumnElement[bool]:
        """Live: heartbeated within ``PAGEDQ_HEARTBEAT_TIMEOUT``; a silent worker's jobs are requeued."""
        return cls.heartbeat_at > utcnow() - timedelta(seconds=heartbeat_timeout)


class File(Base):
    """An uploaded file (``purpose=batch``) or a batch's output or error file, as OpenAI's Files API."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_file_id)
    key_id: Mapped[str | None] = owner_column()
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int]
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)  # None: kept


class Batch(Base):
    """An OpenAI-style batch: one input file, one job per line, an output and an error file at the end."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_batch_id)
    key_id: Mapped[str | None] = owner_column()
    status: Mapped[str] = mapped_column(String(16))  # OpenAI's: validating … completed, see core.states
    endpoint: Mapped[str] = mapped_column(String(64))
    model: Mapped[str | None] = mapped_column(String(200))
    input_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    output_file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"))
    error_file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"))
    completion_window: Mapped[str] = mapped_column(String(16))
    meta: Mapped[dict[str, str] | None] = mapped_column("metadata", JSONType)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)  # line-numbered validation errors
    priority: Mapped[int] = mapped_column(default=0)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(JSONType)
    total: Mapped[int] = mapped_column(default=0)  # lines, i.e. jobs
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Retention: ``output_expires_after`` seconds (None: PAGEDQ_RETENTION_DAYS), counted from when the
    # output is written; ``retained_until`` is set when the batch ends (``expires_at`` is its window's end).
    output_expires_after: Mapped[int | None]
    retained_until: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    # While it runs, every reconcile round (worker/estimates.py): when it should end at its model's measured
    # rate, and since when that is past ``expires_at`` (its one ``batch.at_risk`` event was recorded then).
    estimated_completion_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    at_risk_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A replay batch (POST /v1/batches/{id}/replay): the batch it replays, and, written when it is finalized,
    # its lines compared with their originals (core/replay.py's ``counted``).
    replay_of: Mapped[str | None] = mapped_column(String(40))
    replay_counts: Mapped[dict[str, Any] | None] = mapped_column(JSONType)

    __table_args__ = (Index("ix_batches_status", "status"),)


class WebhookDelivery(Base):
    """One event for one endpoint (the outbox): written in the transaction that caused the event, then
    sent by the webhooks queue; ``id`` is the Standard Webhooks ``webhook-id``, stable across retries."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_delivery_id)
    event_type: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"))
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id"))
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered | failed
    attempts: Mapped[list[dict[str, Any]]] = mapped_column(
        JSONType, default=list
    )  # time, status, latency, error
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=utcnow)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    __table_args__ = (
        Index("ix_webhook_deliveries_job_id", "job_id"),
        Index("ix_webhook_deliveries_batch_id", "batch_id"),
        Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),
    )


@cache
def _column_defaults() -> tuple[tuple[str, str, Any], ...]:
    """Each column attribute of ``Job``, its column's name and its Python-side default (None: none)."""
    return tuple(
        (prop.key, prop.columns[0].name, prop.columns[0].default) for prop in Job.__mapper__.column_attrs
    )
