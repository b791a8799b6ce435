"""The API's wire types, separate from the tables: what a client reads back about its jobs.

Timings are defined, and derived, in ``core/timings.py``; choices are read in ``core/choices.py``.
"""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from core.choices import choices_of
from core.models import Job, Worker
from core.states import JobStatus
from core.timings import timings


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")
    total_tokens: int


class Timings(BaseModel):
    queued_at: datetime
    started_at: datetime | None = Field(description="first scheduled by the engine")
    first_token_at: datetime | None
    finished_at: datetime | None
    queue_time_ms: float | None = Field(description="started_at − queued_at")
    time_to_first_token_ms: float | None = Field(description="first_token_at − started_at (engine only)")
    e2e_latency_ms: float | None = Field(description="finished_at − queued_at")
    mean_time_per_output_token_ms: float | None = Field(
        description="(last token time − first token time) / (tokens − 1)"
    )
    token_times_ms: list[float] = Field(description="per generated token: ms since started_at")

    @classmethod
    def of(cls, job: Job) -> "Timings":
        return cls(
            queued_at=job.queued_at,
            started_at=job.started_at,
            first_token_at=job.first_token_at,
            finished_at=job.finished_at,
            token_times_ms=job.token_times_ms,
            **timings(job).reported(),
        )


class ChoiceOut(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int

    @classmethod
    def all_of(cls, job: Job) -> list["ChoiceOut"]:
        return [
            cls(index=i, text=c.text, finish_reason=c.finish_reason, completion_tokens=c.completion_tokens)
            for i, c in enumerate(choices_of(job))
        ]


class JobOut(BaseModel):
    """A job as the API reports it; ``output`` grows while it runs (flushed about once a second)."""

    id: str
    status: JobStatus
    model: str
    priority: int
    params: dict[str, Any] = Field(description="the sampling parameters it runs with")
    metadata: dict[str, str]
    webhook_url: str | None
    webhook_events: list[str] | None = Field(description="the events webhook_url receives; null: all")
    batch_id: str | None = Field(description="the batch whose input file held this job's line")
    custom_id: str | None = Field(description="that line's custom_id")
    key_id: str | None = Field(description="the id of the API key that submitted it; null: none")
    output: str = Field(description="the generated text (of the first choice); partial while running")
    finish_reason: str | None = Field(description="stop, length, abort, … once finished")
    choices: list[ChoiceOut] = Field(description="every sample (n) or returned beam, best first for beams")
    error: str | None
    cancel_requested: bool
    attempt: int = Field(description="how many times a worker has claimed it")
    worker_id: str | None = Field(description="the worker that claimed it last")
    usage: Usage
    timings: Timings
    expires_at: datetime | None = Field(
        description="when it is deleted, if it has ended by then; null: kept (a batch's job: with its batch)"
    )

    @classmethod
    def of(cls, job: Job) -> "JobOut":
        return cls(
            id=job.id,
            status=job.status,
            model=job.model,
            priority=job.priority,
            params=job.params,
            metadata=job.meta,
            webhook_url=job.webhook_url,
            webhook_events=job.webhook_events,
            batch_id=job.batch_id,
            custom_id=job.custom_id,
            key_id=job.key_id,
            output=job.output_text,
            finish_reason=job.finish_reason,
            choices=ChoiceOut.all_of(job),
            error=job.error,
            cancel_requested=job.cancel_requested,
            attempt=job.attempt,
            worker_id=job.worker_id,
            usage=Usage(
                prompt_tokens=job.prompt_tokens,
                completion_tokens=job.completion_tokens,
                cached_tokens=job.cached_tokens,
                total_tokens=job.prompt_tokens + job.completion_tokens,
            ),
            timings=Timings.of(job),
            expires_at=job.expires_at,
        )


class JobDeleted(BaseModel):
    id: str
    object: Literal["job"] = "job"
    deleted: bool


class JobList(BaseModel):
    data: list[JobOut] = Field(description="newest first")
    has_more: bool
    next_cursor: str | None = Field(description="pass as `after` for the next page; null on the last")


class ErrorOut(BaseModel):
    """Every error but 422."""

    detail: str = Field(description="what is wrong")


class Problem(BaseModel):
    type: str = Field(description="a machine-readable kind, e.g. extra_forbidden, json_invalid")
    loc: list[str | int] = Field(description='where: ["body", "max_tokens"], ["header", "Idempotency-Key"]')
    msg: str = Field(description="what is wrong, for a person")


class InvalidOut(BaseModel):
    """A 422: one item per problem found in the request (FastAPI's shape, without the echoed input)."""

    detail: list[Problem]


class Health(BaseModel):
    status: str = "ok"


class Readiness(BaseModel):
    status: str = Field(description="ok, or unavailable")
    checks: dict[str, str] = Field(description="per dependency: ok, or why not")


class WorkerOut(BaseModel):
    """A live worker and its engine's gauges, as of its last heartbeat."""

    id: str
    model: str
    started_at: datetime
    heartbeat_at: datetime
    stats: dict[str, float] = Field(
        description="num_running, num_waiting, kv_cache_usage (0–1), tokens_per_s, num_preemptions, …"
    )

    @classmethod
    def of(cls, worker: Worker) -> "WorkerOut":
        fields = ("id", "model", "started_at", "heartbeat_at", "stats")
        return cls.model_validate({name: getattr(worker, name) for name in fields})


class Minute(BaseModel):
    at: datetime = Field(description="the minute's start")
    jobs: int = Field(description="jobs that finished in it")
    tokens_per_s: float = Field(description="tokens generated by those jobs, per second of the minute")
    median_ttft_ms: float | None = Field(description="their median time to first token")


class Overview(BaseModel):
    now: datetime
    scope: Literal["all", "key"] = Field(
        description="all: the whole service (an admin key, or auth off); key: the caller's own"
    )
    jobs: dict[JobStatus, int] = Field(description="jobs by status")
    queue_depth: int | None = Field(
        description="all: messages waiting in the broker (null if it did not answer); key: its queued jobs"
    )
    oldest_queued_age_s: float | None = Field(description="how long the oldest queued job in scope waited")
    workers: list[WorkerOut] = Field(description="workers with a recent heartbeat; shown to admin keys only")
    last_hour: list[Minute] = Field(description="oldest first, one per minute")


class Histogram(BaseModel):
    """Counts per bucket: ``counts[i]`` jobs took at most ``le_ms[i]`` (and more than the bucket before);
    the last count is over the last bound."""

    le_ms: list[float]
    counts: list[int]


class BatchLatency(BaseModel):
    jobs: int = Field(description="the batch's jobs that have ended")
    e2e_latency: Histogram = Field(description="queued to finished, of succeeded jobs")
    queue_time: Histogram = Field(description="queued to first scheduled, of every job that started")


class JobRequest(BaseModel):
    """What a job was asked: its prompt, or its chat messages (the template applied at submission)."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    prompt_tokens: int
