"""An embeddings request as a job of its model: checked and tokenized at submission (api/embeddings/
encoder.py), one row and one message (``api/jobs/submitter.py``), then waited on like any online request.

The job is light: its inputs' token ids, its parameters, and once done its vectors (``jobs.embeddings``);
no per-token rows, no live stream. Errors are OpenAI's (``OpenAIError``), as on the other OpenAI routes.
"""

from typing import Any

from starlette.concurrency import run_in_threadpool

from api.deps import Service
from api.embeddings.encoder import EmbeddingInputError, Inputs
from api.embeddings.schemas import EmbeddingsBody
from api.http.caller import Caller
from api.http.limits import check_sizes
from api.jobs.queries import admit_tokens
from api.openai.online import OpenAIError
from core.embeddings import EMBEDDINGS_ENDPOINT, embedding_body
from core.models import Job, utcnow
from core.retention import deadline
from core.served_models import ModelEntry
from core.states import JobStatus


async def submit(service: Service, caller: Caller, body: EmbeddingsBody, inputs: Inputs) -> Job:
    entry = service.models.embedding(body.model)  # UnknownModel (404), WrongKind (400)
    encoder = await run_in_threadpool(service.models.embedder, entry.name)
    if caller.limits is not None:  # off the event loop: a Redis round trip
        await run_in_threadpool(service.limiter.request, caller)
    try:
        token_ids = await encoder.run(encoder.encode, inputs, body.params())
    except EmbeddingInputError as error:
        raise OpenAIError(400, str(error), error.param, "invalid_value") from None
    tokens = sum(map(len, token_ids))
    job = _new_job(service, entry, body, token_ids, tokens)
    job.key_id = caller.key_id
    if caller.limits is not None:
        check_sizes(caller.limits, max(map(len, token_ids)), 0, 1, ("body", "input"))
        await run_in_threadpool(admit_tokens, service, caller, tokens)
    await service.submitter.submit(job, caller)
    return job


def _new_job(
    service: Service, entry: ModelEntry, body: EmbeddingsBody, token_ids: list[list[int]], tokens: int
) -> Job:
    now = utcnow()
    params = {
        "truncate_prompt_tokens": body.truncate_prompt_tokens,
        "dimensions": body.dimensions,
        "encoding_format": body.encoding_format,
    }
    return Job(
        status=JobStatus.QUEUED,
        model=entry.name,
        priority=0,
        prompt_token_ids=token_ids,
        prompt_tokens=tokens,
        params=params,
        meta={},
        endpoint=EMBEDDINGS_ENDPOINT,
        queued_at=now,
        published_at=now,
        expires_at=deadline(now, service.settings),
    )


def response_body(job: Job) -> dict[str, Any]:
    if job.status != JobStatus.SUCCEEDED:
        raise OpenAIError(500, f"job {job.id} {job.status}: {job.error or 'no output'}", None, "job_failed")
    return embedding_body(job, job.params.get("encoding_format", "float"))
