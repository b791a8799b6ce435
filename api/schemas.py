"""The API's wire types, separate from the tables: what a client reads back about its jobs.

Timings (milliseconds; null until both ends exist):

- ``queue_time_ms`` = started_at − queued_at: waiting for a worker's engine to schedule the job.
- ``time_to_first_token_ms`` = first_token_at − started_at: the engine's prefill latency. The client's
  end-to-end time to first token is ``queue_time_ms + time_to_first_token_ms``.
- ``e2e_latency_ms`` = finished_at − queued_at: submission to final result.
- ``mean_time_per_output_token_ms`` = (last token − first token) / (tokens − 1), from ``token_times_ms``.
- ``token_times_ms``: when each generated token was produced, in ms since started_at.
"""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from core.models import Job
from core.states import JobStatus


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
        times = job.token_times_ms or []
        return cls(
            queued_at=job.queued_at,
            started_at=job.started_at,
            first_token_at=job.first_token_at,
            finished_at=job.finished_at,
            queue_time_ms=_ms_between(job.queued_at, job.started_at),
            time_to_first_token_ms=_ms_between(job.started_at, job.first_token_at),
            e2e_latency_ms=_ms_between(job.queued_at, job.finished_at),
            mean_time_per_output_token_ms=_mean_gap(times),
            token_times_ms=times,
        )


def _mean_gap(times: list[float]) -> float | None:
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def _ms_between(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() * 1000 if start and end else None


class ChoiceOut(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int

    @classmethod
    def all_of(cls, job: Job) -> list["ChoiceOut"]:
        if not job.choices:
            return [
                cls(
                    index=0,
                    text=job.output_text,
                    finish_reason=job.finish_reason,
                    completion_tokens=job.completion_tokens,
                )
            ]
        return [cls(index=i, **choice) for i, choice in enumerate(job.choices)]


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
    output: str = Field(description="the generated text (of the first choice); partial while running")
    finish_reason: str | None = Field(description="stop, length, abort, … once finished")
    choices: list[ChoiceOut] = Field(description="every sample (n) or returned beam, best first for beams")
    error: str | None
    cancel_requested: bool
    attempt: int = Field(description="how many times a worker has claimed it")
    usage: Usage
    timings: Timings

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
            output=job.output_text,
            finish_reason=job.finish_reason,
            choices=ChoiceOut.all_of(job),
            error=job.error,
            cancel_requested=job.cancel_requested,
            attempt=job.attempt,
            usage=Usage(
                prompt_tokens=job.prompt_tokens,
                completion_tokens=job.completion_tokens,
                cached_tokens=job.cached_tokens,
                total_tokens=job.prompt_tokens + job.completion_tokens,
            ),
            timings=Timings.of(job),
        )


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
