"""A batch's output and error files, one line per job in input order, in OpenAI's batch output format.

An output line: ``{"id": "batch_req_…", "custom_id", "response": {"status_code": 200, "request_id",
"body": <a chat.completion, text_completion or embeddings list>}, "error": null, "timings": {…}}``;
``timings`` is pagedq's extension (the job's queue time, time to first token, latency and per-token
times, in ms), and so is ``manifest_digest``, the digest of the job's manifest (``GET
/v1/jobs/{id}/manifest``'s ``digest``).
An error line: ``{"id", "custom_id", "response": null, "error": {"code", "message"}}``.
"""

import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, load_only

from core.embeddings import EMBEDDINGS_ENDPOINT, embedding_body
from core.manifest import manifest, manifest_digest
from core.models import Batch, Job
from core.openai_format import completion_body
from core.states import BatchStatus, JobStatus
from core.timings import timings

COLUMNS = (
    Job.custom_id,
    Job.status,
    Job.model,
    Job.output_text,
    Job.choices,
    Job.finish_reason,
    Job.error,
    Job.prompt_tokens,
    Job.completion_tokens,
    Job.cached_tokens,
    Job.token_logprobs,
    Job.attempt,
    Job.queued_at,
    Job.started_at,
    Job.first_token_at,
    Job.finished_at,
    Job.prompt_token_ids,  # with id, status and model: the manifest (core/manifest.py)
    Job.params,
    Job.served_by,
    Job.output_token_ids,
    Job.replay_of,
)
EMBEDDING_COLUMNS = (*COLUMNS, Job.embeddings)  # core/embeddings.py's body
CANCELLED_CODE = {BatchStatus.CANCELLED: "batch_cancelled", BatchStatus.EXPIRED: "batch_expired"}


def result_files(session: Session, batch: Batch, ending: BatchStatus) -> tuple[bytes, bytes]:
    """The output file (succeeded jobs) and the error file (failed and cancelled ones), in input order
    (a batch's job ids count up line by line)."""
    output: list[bytes] = []
    errors: list[bytes] = []
    for job in _jobs(
        session, batch.id, EMBEDDING_COLUMNS if batch.endpoint == EMBEDDINGS_ENDPOINT else COLUMNS
    ):
        if job.status == JobStatus.SUCCEEDED:
            response = _response(job, batch.endpoint)
            output.append(_line(job, response=response, timings=_timings(job), manifest_digest=_digest(job)))
        else:
            errors.append(_line(job, error=_error(job, ending)))
    return b"".join(output), b"".join(errors)


def _jobs(session: Session, batch_id: str, columns: tuple[Any, ...]) -> Iterator[Job]:
    query = select(Job).options(load_only(*columns)).where(Job.batch_id == batch_id).order_by(Job.id)
    return iter(session.scalars(query.execution_options(yield_per=2000)))


def _line(job: Job, **fields: Any) -> bytes:
    line = {"id": "batch_req_" + job.id.removeprefix("job_"), "custom_id": job.custom_id}
    line |= {"response": None, "error": None} | fields
    return json.dumps(line, ensure_ascii=False).encode() + b"\n"


def _response(job: Job, endpoint: str) -> dict[str, Any]:
    if endpoint == EMBEDDINGS_ENDPOINT:
        body = embedding_body(job, job.params.get("encoding_format", "float"))
    else:
        body = completion_body(job, endpoint, int((job.started_at or job.queued_at).timestamp()))
    return {"status_code": 200, "request_id": job.id, "body": body}


def _timings(job: Job) -> dict[str, Any]:
    return timings(job).reported() | {"token_times_ms": job.token_times_ms}


def _digest(job: Job) -> str:
    return manifest_digest(manifest(job))


def _error(job: Job, ending: BatchStatus) -> dict[str, str]:
    if job.status == JobStatus.FAILED:
        return {"code": "job_failed", "message": job.error or "the job failed"}
    code = CANCELLED_CODE.get(ending, "job_cancelled")
    messages = {
        "batch_cancelled": "the batch was cancelled before this request finished",
        "batch_expired": "the batch's completion window ran out before this request finished",
        "job_cancelled": f"job {job.id} was cancelled",
    }
    return {"code": code, "message": messages[code]}
