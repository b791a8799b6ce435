"""OpenAI's wire shapes for batches (files: ``api/files/schemas.py``), so that the official SDK reads
pagedq's answers as its own.

Times are Unix seconds. pagedq's extensions: a batch's ``priority``, ``webhook_url`` and ``webhook_events``
(the SDK sends them through ``extra_body``), ``usage`` counting tokens while the batch runs, and a replay
batch's ``replay``.
"""

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

from api.batches.lines import Endpoint
from api.files.schemas import ExpiresAfter, unix
from core.batches import Tally
from core.models import Batch
from core.spec import Metadata, Text
from core.states import BatchStatus
from core.webhooks import BatchEvent
from core.windows import MAX_WINDOW_HOURS, checked_window, window_length


class BatchDeleted(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    deleted: bool


class BatchIn(BaseModel):
    """``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: Text = Field(description="an uploaded file with purpose=batch")
    endpoint: Endpoint
    completion_window: str = Field(
        description=f"`<N>h`, 1 ≤ N ≤ {MAX_WINDOW_HOURS} (OpenAI: 24h): when it runs out, unfinished "
        "requests are cancelled and the batch ends `expired`"
    )
    metadata: Metadata | None = Field(None, max_length=16)
    output_expires_after: ExpiresAfter | None = Field(
        None,
        description="how long the batch, its jobs and its output and error files are kept once the output "
        "is written; default: PAGEDQ_RETENTION_DAYS",
    )
    priority: int | None = Field(
        None,
        ge=-100,
        le=100,
        description="pagedq: every job's priority (lower runs first); default: "
        "PAGEDQ_BATCH_PRIORITY, after online requests",
    )
    webhook_url: HttpUrl | None = Field(
        None, description="pagedq: receives this batch's end (Standard Webhooks)"
    )
    webhook_events: list[BatchEvent] | None = Field(
        None, max_length=4, description="pagedq: the events webhook_url receives; default: all batch events"
    )

    @field_validator("completion_window")
    @classmethod
    def _hours(cls, window: str) -> str:
        return checked_window(window)

    @property
    def window(self) -> timedelta:
        return window_length(self.completion_window)


class BatchError(BaseModel):
    code: str
    message: str
    line: int | None = Field(description="1-based line of the input file")
    param: str | None = Field(description="the field at fault, e.g. body.max_tokens")


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int = Field(description="succeeded")
    failed: int = Field(description="failed or cancelled")


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class BatchReplay(BaseModel):
    """A replay batch's lines compared with their originals (``POST /v1/batches/{id}/replay``), each as a
    job's ``replay`` compares it; the counts are null until the batch has ended."""

    replay_of: str = Field(description="the batch it replays")
    identical: int | None = Field(
        description="lines whose every choice's output token ids equal the original's"
    )
    different: int | None = Field(
        description="lines whose tokens differ (a line whose original is gone counts in neither)"
    )
    same_model: bool | None = Field(
        description="false if a model with another content digest served some line (an upgrade, say); null "
        "while unknown"
    )

    @classmethod
    def of(cls, batch: Batch) -> "BatchReplay | None":
        if batch.replay_of is None:
            return None
        counts = batch.replay_counts or {"identical": None, "different": None, "same_model": None}
        return cls(replay_of=batch.replay_of, **counts)


class BatchOut(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str = Field(
        description="in_progress, finalizing, completed | failed | cancelling, cancelled | expired"
    )
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None = Field(
        description="when the window ran out (the status turns expired once running requests have stopped)"
    )
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    usage: BatchUsage
    metadata: dict[str, str] | None
    priority: int
    webhook_url: str | None
    webhook_events: list[str] | None
    estimated_completion_at: int | None = Field(
        description="while in progress: when it should end, at its model's measured rate and the work "
        "queued ahead of it, updated as it runs; null until the model has a measured rate"
    )
    at_risk: bool = Field(description="its estimated end is past expires_at (a batch.at_risk event, once)")
    replay: BatchReplay | None = Field(
        None, description="pagedq: a replay batch's comparison with the batch it replays"
    )

    @classmethod
    def of(cls, batch: Batch, tally: Tally) -> "BatchOut":
        running = batch.status == BatchStatus.IN_PROGRESS
        return cls(
            id=batch.id,
            endpoint=batch.endpoint,
            model=batch.model,
            errors=BatchErrors(data=batch.errors) if batch.errors else None,  # type: ignore[arg-type]
            input_file_id=batch.input_file_id,
            completion_window=batch.completion_window,
            status=batch.status,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            created_at=int(batch.created_at.timestamp()),
            in_progress_at=unix(batch.in_progress_at),
            expires_at=unix(batch.expires_at),
            finalizing_at=unix(batch.finalizing_at),
            completed_at=unix(batch.completed_at),
            failed_at=unix(batch.failed_at),
            expired_at=unix(batch.expired_at),
            cancelling_at=unix(batch.cancelling_at),
            cancelled_at=unix(batch.cancelled_at),
            request_counts=RequestCounts(total=batch.total, completed=tally.completed, failed=tally.failed),
            usage=_usage(tally),
            metadata=batch.meta,
            priority=batch.priority,
            webhook_url=batch.webhook_url,
            webhook_events=batch.webhook_events,
            estimated_completion_at=unix(batch.estimated_completion_at) if running else None,
            at_risk=running and batch.at_risk_at is not None,
            replay=BatchReplay.of(batch),
        )


def _usage(tally: Tally) -> BatchUsage:
    return BatchUsage(
        input_tokens=tally.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=tally.cached_tokens),
        output_tokens=tally.completion_tokens,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=tally.prompt_tokens + tally.completion_tokens,
    )


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchOut] = Field(description="newest first")
    first_id: str | None
    last_id: str | None
    has_more: bool


class Histogram(BaseModel):
    """Counts per bucket: ``counts[i]`` jobs took at most ``le_ms[i]`` (and more than the bucket before);
    the last count is over the last bound."""

    le_ms: list[float]
    counts: list[int]


class BatchLatency(BaseModel):
    jobs: int = Field(description="the batch's jobs that have ended")
    e2e_latency: Histogram = Field(description="queued to finished, of succeeded jobs")
    queue_time: Histogram = Field(description="queued to claimed, of every job that started")
