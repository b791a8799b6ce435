"""``/v1/jobs``: submit, read, list and cancel jobs."""

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from api.deps import Service, ServiceDep
from api.http.auth import CallerDep
from api.http.caller import OPEN
from api.http.responses import INVALID, MODEL_REFUSED, InvalidOut, error, not_found
from api.jobs import queries as jobs
from api.jobs.schemas import JobDeleted, JobList, JobOut, JobRequest, Manifest
from api.jobs.streams import encoded, job_events
from api.jobs.waiting import wait_preference
from core.models import Job
from core.spec import JobSpec, Text
from core.states import TERMINAL, JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

NOT_FOUND = not_found("job")
LOCATION = {"Location": {"description": "the job's URL", "schema": {"type": "string"}}}
APPLIED = {
    "Preference-Applied": {"description": "`wait=N` when a wait was honoured", "schema": {"type": "string"}}
}

IdempotencyKey = Annotated[
    Text | None,
    Header(
        alias="Idempotency-Key",
        max_length=255,
        description="Retrying with the same key and body returns the first job (200) instead of a new "
        "one; the same key with a different body is a 422.",
    ),
]
Prefer = Annotated[
    str | None,
    Header(
        alias="Prefer",
        description="`wait=N`: hold the answer up to N seconds (capped by the server's max_wait_seconds) "
        "and return the finished job with 200 if it finishes by then, else 202 with the job as it is "
        "then (running, its attempt and partial output).",
    ),
]


@router.post(
    "",
    status_code=202,
    summary="Submit a job",
    responses={
        202: {
            "description": "Queued (or still running after a `Prefer: wait`)",
            "headers": LOCATION | APPLIED,
        },
        200: {
            "model": JobOut,
            "description": "Finished within `Prefer: wait`, or the job an earlier request with this "
            "Idempotency-Key created",
            "headers": LOCATION | APPLIED,
        },
        **INVALID,
        **MODEL_REFUSED,
        422: {
            "model": InvalidOut,
            "description": "Invalid body, prompt longer than the context, key reused",
        },
    },
)
async def submit_job(
    spec: JobSpec,
    response: Response,
    service: ServiceDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
    prefer: Prefer = None,
) -> JobOut:
    job, created = await jobs.submit(service, caller, spec, idempotency_key)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    wait = wait_preference(prefer, service.settings.max_wait_seconds)
    if wait is not None:
        response.headers["Preference-Applied"] = f"wait={wait:g}"
        job = await _wait_for(service, job, wait)
    response.status_code = 202 if created and job.status not in TERMINAL else 200
    return JobOut.of(job)


async def _wait_for(service: Service, job: Job, seconds: float) -> Job:
    """The job as it is once it finishes or ``seconds`` pass: finished, or running with its partial output."""
    if job.status in TERMINAL:
        return job
    await service.waiter.wait(job.id, seconds)
    return await run_in_threadpool(jobs.get, service, OPEN, job.id)  # the caller's own job


@router.get(
    "/{job_id}",
    summary="Read a job: status, output (partial while running), usage, timings",
    responses=NOT_FOUND,
)
def get_job(job_id: str, service: ServiceDep, caller: CallerDep) -> JobOut:
    return JobOut.of(jobs.get(service, caller, job_id))


@router.get(
    "/{job_id}/request",
    summary="What a job was asked: its prompt or messages (not in the job's view, which lists carry)",
    responses=NOT_FOUND,
)
def get_job_request(job_id: str, service: ServiceDep, caller: CallerDep) -> JobRequest:
    job = jobs.get(service, caller, job_id)
    return JobRequest(prompt=job.prompt, messages=job.messages, prompt_tokens=job.prompt_tokens)


@router.get(
    "/{job_id}/manifest",
    summary="What a job ran and produced: model and tokenizer digests, version, numerics, effective "
    "parameters with the seed, prompt and output token ids",
    responses=NOT_FOUND,
)
def get_job_manifest(job_id: str, service: ServiceDep, caller: CallerDep) -> Manifest:
    return Manifest.of(jobs.get(service, caller, job_id))


@router.post(
    "/{job_id}/replay",
    status_code=202,
    summary="Run a job again with the same request and seed; the new job's `replay` compares their tokens",
    responses={202: {"headers": LOCATION}, **NOT_FOUND},
)
async def replay_job(job_id: str, response: Response, service: ServiceDep, caller: CallerDep) -> JobOut:
    job = await jobs.replay(service, caller, job_id)
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return JobOut.of(job)


async def _existing(job_id: str, service: ServiceDep, caller: CallerDep) -> Job:
    return await run_in_threadpool(jobs.get, service, caller, job_id)


EVENT_STREAM = {
    200: {
        "description": "`text/event-stream`: `delta` events, perhaps `restart`, then one `job` event",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.get(
    "/{job_id}/events",
    summary="Follow a job: its text as it is produced, then the finished job (Server-Sent Events)",
    description="Events: `delta` `{text}` for each new piece of output (a late client first gets "
    "everything produced so far), `restart` `{attempt}` if the job is requeued after a fault and starts "
    "over, and last `job`: the finished job as `GET /v1/jobs/{id}` returns it.",
    responses=EVENT_STREAM | NOT_FOUND,
    response_class=Response,
)
async def follow_job(job: Annotated[Job, Depends(_existing)], service: ServiceDep) -> Response:
    return EventSourceResponse(encoded(job_events(service, job)))


LIST_DESCRIPTION = """Newest first, a page at a time: pass the `next_cursor` of a page as `after` to get the
next one.

Filter by metadata with query parameters named `metadata.<key>`: `?metadata.user=ann&metadata.batch=7`
returns the jobs whose metadata has `user` equal to `ann` and `batch` equal to `7` (exact string match).
`status` may be repeated: `?status=queued&status=running`. `batch_id` lists the jobs of one batch (its
lines, newest first: in reverse input order). `key` (a key's name or id) lists the jobs that key submitted:
an admin key may name any key; a user key sees only its own jobs, so naming another key gives an empty
list."""


@router.get("", summary="List jobs", description=LIST_DESCRIPTION, responses=INVALID)
def list_jobs(
    request: Request,
    service: ServiceDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="jobs per page")] = 50,
    after: Annotated[str | None, Query(description="a `next_cursor`: jobs older than it")] = None,
    status: Annotated[list[JobStatus] | None, Query(description="only jobs in these states")] = None,
    batch_id: Annotated[str | None, Query(description="only the jobs of this batch")] = None,
    key: Annotated[str | None, Query(description="only the jobs this key (its name or id) submitted")] = None,
    model: Annotated[str | None, Query(description="only the jobs of this served model")] = None,
) -> JobList:
    metadata = {
        key.removeprefix("metadata."): value
        for key, value in request.query_params.multi_items()
        if key.startswith("metadata.")
    }
    page, has_more = jobs.page(service, caller, limit, after, status or [], metadata, batch_id, key, model)
    return JobList(
        data=[JobOut.of(job) for job in page],
        has_more=has_more,
        next_cursor=page[-1].id if has_more else None,
    )


@router.post(
    "/{job_id}/cancel",
    summary="Cancel a job",
    description="A queued job is cancelled at once (200). A running job is asked to stop (202): its worker "
    "aborts it within a second or so and records it as cancelled, keeping the partial output.",
    responses={
        200: {"description": "Cancelled"},
        202: {"model": JobOut, "description": "Cancellation requested; the worker stops it shortly"},
        **error(409, "Already finished"),
        **NOT_FOUND,
    },
)
def cancel_job(job_id: str, response: Response, service: ServiceDep, caller: CallerDep) -> JobOut:
    job, cancelled = jobs.cancel(service, caller, job_id)
    response.status_code = 200 if cancelled else 202
    return JobOut.of(job)


@router.delete(
    "/{job_id}",
    summary="Delete a job",
    description="An ended job is deleted with its output, token times, webhook deliveries and live stream. "
    "A queued or running job is refused (409): cancel it first, then delete it once it has stopped. A job "
    "of a batch is deleted with its batch (`DELETE /v1/batches/{id}`).",
    responses=error(409, "Not ended yet, or a line of a batch") | NOT_FOUND,
)
def delete_job(job_id: str, service: ServiceDep, caller: CallerDep) -> JobDeleted:
    jobs.delete(service, caller, job_id)
    return JobDeleted(id=job_id, deleted=True)
