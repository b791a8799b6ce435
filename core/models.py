"""The tables, as SQLAlchemy 2 typed models. Alembic (``migrations/``) owns their schema history."""

import os
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Index, String, Text, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from core.states import JobStatus

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


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_job_id() -> str:
    """Time-ordered ids (48 bits of milliseconds, 80 random bits), so id order is creation order."""
    return f"job_{int(time.time() * 1000):012x}{os.urandom(10).hex()}"


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=new_job_id)
    status: Mapped[JobStatus] = mapped_column(String(16), default=JobStatus.QUEUED)
    model: Mapped[str] = mapped_column(String(200))
    priority: Mapped[int] = mapped_column(default=0)
    prompt: Mapped[str | None] = mapped_column(Text)
    messages: Mapped[list[dict[str, str]] | None] = mapped_column(JSONType)
    prompt_token_ids: Mapped[list[int]] = mapped_column(JSONType)
    params: Mapped[dict[str, Any]] = mapped_column(JSONType)  # the engine's SamplingParams
    meta: Mapped[dict[str, str]] = mapped_column("metadata", JSONType, default=dict)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))

    # Delivery: every claim by a worker bumps ``attempt``; writes are conditional on it.
    attempt: Mapped[int] = mapped_column(default=0)
    worker_id: Mapped[str | None] = mapped_column(String(120))
    cancel_requested: Mapped[bool] = mapped_column(default=False)

    # Results, written while running (partial) and once at the end.
    output_text: Mapped[str] = mapped_column(Text, default="")
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    cached_tokens: Mapped[int] = mapped_column(default=0)
    token_times_ms: Mapped[list[float]] = mapped_column(JSONType, default=list)  # since started_at

    queued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # last handed to the broker
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # first scheduled by the engine
    first_token_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_jobs_status_queued_at", "status", "queued_at"),
        Index("ix_jobs_worker_id", "worker_id"),
    )


class Worker(Base):
    """A live worker: its heartbeat proves its running jobs are alive; its stats feed /metrics."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    stats: Mapped[dict[str, float]] = mapped_column(JSONType, default=dict)
