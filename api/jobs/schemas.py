"""The API's wire types, separate from the tables: what a client reads back about its jobs.

Timings are defined, and derived, in ``core/timings.py``; choices are read in ``core/choices.py``.
"""

from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import inspect

from core.choices import choices_of
from core.manifest import manifest, manifest_digest
from core.models import Job
from core.replay import compare
from core.states import JobStatus
from core.timings import timings


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")
    total_tokens: int
    engine_ms: float = Field(
        description="engine time it used: its share of every engine step it ran in, a step's wall time split "
        "over its rows by tokens computed (the current run's; a retried job's earlier runs are not counted)"
    )


class Timings(BaseModel):
    queued_at: datetime
    started_at: datetime | None = Field(description="claimed by a worker: running from then")
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


class RunOut(BaseModel):
    attempt: int
    resumed_from_token: int = Field(description="output tokens of the earlier run it went on from; 0: none")


class ReplayOut(BaseModel):
    """How a replay's tokens compare with its original's (``POST /v1/jobs/{id}/replay``)."""

    replay_of: str = Field(description="the job it replays")
    identical: bool | None = Field(
        description="every choice's output token ids equal the original's; null until both have ended "
        "(or the original is gone)"
    )
    first_divergence: int | None = Field(description="the first output token index where they differ")
    same_model: bool | None = Field(
        description="served by a model with the same content digest; false: a different model (an "
        "upgrade, say), which explains a divergence"
    )

    @classmethod
    def compare(cls, job: Job) -> "ReplayOut | None":
        if job.replay_of is None:
            return None
        # a job just made here was never loaded with its original, and has not ended anyway
        original = None if "original" in inspect(job).unloaded else job.original
        return cls(replay_of=job.replay_of, **asdict(compare(job, original)))


class Manifest(BaseModel):
    """What a job ran and produced, enough to reproduce and audit it (``GET /v1/jobs/{id}/manifest``)."""

    job_id: str
    status: JobStatus
    model: str = Field(description="the served model's name")
    served_by: dict[str, Any] | None = Field(
        description="what served its last run: model_digest (sha256 over the weight files), "
        "tokenizer_digest, pagedq_version, device, dtype, quantization, kernel_backend, batch_invariant; "
        "null before a worker claimed it"
    )
    params: dict[str, Any] = Field(description="the effective sampling parameters, its seed included")
    prompt_token_ids: list[int]
    output_token_ids: list[list[int]] = Field(
        description="each choice's output token ids (while running: the first choice's flushed so far)"
    )
    replay_of: str | None
    digest: str = Field(
        description="sha256 of the other fields' canonical JSON (keys sorted, no spaces, UTF-8), as a "
        "batch's output line carries it (`manifest_digest`)"
    )

    @classmethod
    def of(cls, job: Job) -> "Manifest":
        content = manifest(job)
        return cls(**content, digest=manifest_digest(content))


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
    runs: list[RunOut] = Field(
        description="each claim: its attempt and resumed_from_token, how many output tokens of the run "
        "before it went on from (0: it started from scratch)"
    )
    worker_id: str | None = Field(description="the worker that claimed it last")
    usage: Usage
    timings: Timings
    deadline_at: datetime | None = Field(
        description="when it is due (its completion_window, or its batch's): the earliest is claimed first "
        "among equal aged priorities; null: none"
    )
    expires_at: datetime | None = Field(
        description="when it is deleted, if it has ended by then; null: kept (a batch's job: with its batch)"
    )
    hint: str | None = Field(None, description="what may explain a surprising result, when something may")
    replay: ReplayOut | None = Field(None, description="a replay's comparison with the job it replays")

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
            runs=[RunOut(**run) for run in job.runs or []],
            worker_id=job.worker_id,
            usage=Usage(
                prompt_tokens=job.prompt_tokens,
                completion_tokens=job.completion_tokens,
                cached_tokens=job.cached_tokens,
                total_tokens=job.prompt_tokens + job.completion_tokens,
                engine_ms=job.engine_ms,
            ),
            timings=Timings.of(job),
            deadline_at=job.deadline_at,
            expires_at=job.expires_at,
            hint=hint(job),
            replay=ReplayOut.compare(job),
        )


RAW_PROMPT_ENDED_AT_ONCE = (
    "the model ended its answer at once: a raw `prompt` reaches a chat (instruct) model without its chat "
    "template, and such models often answer it with their end-of-turn token; send `messages` instead"
)


def hint(job: Job) -> str | None:
    ended_at_once = job.status == JobStatus.SUCCEEDED and job.finish_reason == "stop" and not job.output_text
    return RAW_PROMPT_ENDED_AT_ONCE if ended_at_once and job.prompt is not None else None


class JobDeleted(BaseModel):
    id: str
    object: Literal["job"] = "job"
    deleted: bool


class JobList(BaseModel):
    data: list[JobOut] = Field(description="newest first")
    has_more: bool
    next_cursor: str | None = Field(description="pass as `after` for the next page; null on the last")


class JobRequest(BaseModel):
    """What a job was asked: its prompt, or its chat messages (the template applied at submission)."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    prompt_tokens: int
