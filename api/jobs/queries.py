"""The queries behind the job routes. They block (database, broker): async routes run them in a thread."""

import hashlib
import json
import logging
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import Service
from api.http.caller import Caller
from api.http.limits import admit, check_active, check_sizes
from api.http.problems import Conflict, Invalid, NotFound
from api.prompts.encoder import ContextExceeded, PromptError, job_prefix_key
from core.models import ApiKey, Job, utcnow
from core.retention import deadline, job_live
from core.spec import JobSpec
from core.states import TERMINAL, JobStatus
from core.webhooks import (
    WebhookRefused,
    bare_host,
    checked_address,
    parse_webhook_url,
    publish_deliveries,
    record_event,
)
from core.windows import window_length

logger = logging.getLogger(__name__)


async def submit(
    service: Service, caller: Caller, spec: JobSpec, idempotency_key: str | None, fills_context: bool = False
) -> tuple[Job, bool]:
    """The job for ``spec``, and whether it is new (False: an earlier request with the same key made it).
    ``fills_context``: max_tokens is what the context leaves after the prompt (OpenAI's default).
    The caller's key owns it, and its limits apply (``api/http/limits.py``): a refusal enqueues nothing.

    The row is committed before its id is published, so a worker never receives an id it cannot load.
    A retry (an ``idempotency_key`` whose job exists) is looked up first: free, it returns that job.
    """
    entry = service.models.generating(spec.model)  # 404 for a model not served, 400 for an embedding one
    hashed = request_hash(spec) if idempotency_key else None  # before the context fills max_tokens
    if idempotency_key is not None:
        found = await run_in_threadpool(_find_earlier, service, idempotency_key, caller.key_id, hashed)
        if found is not None:
            return found, False
    if caller.limits is not None:  # off the event loop: a Redis round trip
        await run_in_threadpool(service.limiter.request, caller)
    encoder = await service.models.loaded_encoder(entry.name)
    try:
        token_ids = await encoder.encode_soon(spec)
    except PromptError as error:
        kind = "context_length_exceeded" if isinstance(error, ContextExceeded) else "invalid_prompt"
        raise Invalid(("body", error.field), str(error), kind) from error
    if fills_context:
        spec.max_tokens = encoder.context_length - len(token_ids)
    job = _new_job(service, spec, entry.name, token_ids, idempotency_key, hashed)
    job.key_id = caller.key_id
    if caller.limits is not None:
        check_sizes(caller.limits, len(token_ids), spec.max_tokens, max(spec.n, spec.best_of or 0), ("body",))
        await run_in_threadpool(admit_tokens, service, caller, len(token_ids) + spec.max_tokens)
    if job.webhook_url is not None:
        await run_in_threadpool(check_webhook_url, service, job.webhook_url)  # it may resolve a host name
    if idempotency_key is None:
        await service.submitter.submit(job, caller)
        return job, True
    return await run_in_threadpool(_submit_once, service, job, caller, idempotency_key)


async def replay(service: Service, caller: Caller, job_id: str) -> Job:
    """A new job asking what ``job_id`` asked, with its seed: its view compares their tokens (404 for
    another key's job, or one deleted or expired). It counts against the key's limits as any job does."""
    original = await run_in_threadpool(get, service, caller, job_id)
    entry = service.models.generating(original.model)  # still served, and a chat model (not embeddings)
    now = utcnow()
    job = Job(
        status=JobStatus.QUEUED,
        model=entry.name,
        priority=original.priority,
        key_id=caller.key_id,
        queued_at=now,
        published_at=now,
        expires_at=deadline(now, service.settings),
        **replayed(original),
    )
    if caller.limits is not None:
        await run_in_threadpool(service.limiter.request, caller)
        await run_in_threadpool(admit_tokens, service, caller, job.prompt_tokens + job.params["max_tokens"])
    await service.submitter.submit(job, caller)
    return job


def replayed(original: Job) -> dict[str, Any]:
    """What a replay of ``original`` asks, as ``Job`` attributes: its request, with its seed (in
    ``params``), the job it replays, and its prompt's prefix key. A replay batch's lines are these too."""
    return {
        "prompt": original.prompt,
        "messages": original.messages,
        "prompt_token_ids": original.prompt_token_ids,
        "prompt_tokens": original.prompt_tokens,
        "params": original.params,
        "meta": original.meta,
        "prefix_key": original.prefix_key,
        "replay_of": original.id,
    }


def admit_tokens(service: Service, caller: Caller, tokens: int) -> None:
    """Room for one more active job of the caller's key at first look (the write counts again, exactly),
    then its tokens charged (429 if not)."""
    with service.sessions() as session:
        check_active(session, caller, 1)
    service.limiter.tokens(caller, tokens)


def _submit_once(service: Service, job: Job, caller: Caller, idempotency_key: str) -> tuple[Job, bool]:
    with service.sessions() as session:
        if refused := admit(session, [caller]):
            raise refused[0]
        session.add(job)
        try:
            session.commit()
        except IntegrityError:  # a request with the same key committed meanwhile
            session.rollback()
            earlier = _earlier(session, idempotency_key, job.key_id, job.request_hash)
            if earlier is None:
                message = "insert failed on a unique constraint, but no job has Idempotency-Key"
                raise RuntimeError(f"{message} {idempotency_key!r}") from None
            return earlier, False
    service.submitter.publish([job])
    return job, True


def _new_job(
    service: Service,
    spec: JobSpec,
    model: str,
    token_ids: list[int],
    idempotency_key: str | None,
    hashed: str | None,
) -> Job:
    now = utcnow()
    return Job(
        status=JobStatus.QUEUED,
        model=model,
        priority=spec.priority,
        prompt=spec.prompt,
        messages=[message.model_dump() for message in spec.messages] if spec.messages else None,
        prompt_token_ids=token_ids,
        prompt_tokens=len(token_ids),
        params=spec.engine_params(service.models.encoder(model).sampling_defaults),
        meta=spec.metadata,
        webhook_url=str(spec.webhook_url) if spec.webhook_url else None,
        webhook_events=spec.webhook_events,
        idempotency_key=idempotency_key,
        request_hash=hashed,
        queued_at=now,
        published_at=now,
        expires_at=deadline(now, service.settings),
        deadline_at=now + window_length(spec.completion_window) if spec.completion_window else None,
        prefix_key=job_prefix_key(service.settings, token_ids),
    )


def check_webhook_url(service: Service, url: str) -> None:
    """Refuse a URL whose host does not resolve now, or is or resolves to a special-purpose address (the
    sender resolves and checks again, as DNS can change). Blocks for the lookup: run it in a thread."""
    settings = service.settings
    try:
        checked_address(url, settings.webhook_allow_private, settings.webhook_resolve_timeout)
    except WebhookRefused as refused:
        raise Invalid(("body", "webhook_url"), str(refused), "webhook_url_refused") from None
    except OSError as error:
        host = bare_host(parse_webhook_url(url))
        message = f"webhook URL host {host!r} does not resolve ({error.strerror or error})"
        raise Invalid(("body", "webhook_url"), message, "webhook_url_unresolvable") from None


def request_hash(spec: JobSpec) -> str:
    """sha256 of the canonical body: defaults filled in, keys sorted, so equal requests hash equal."""
    body = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def _find_earlier(service: Service, key: str, key_id: str | None, hashed: str | None) -> Job | None:
    with service.sessions() as session:
        return _earlier(session, key, key_id, hashed)


def _earlier(session: Session, key: str, key_id: str | None, hashed: str | None) -> Job | None:
    """The job an earlier request with Idempotency-Key ``key`` made, or None; 422 if it was another key's
    or another body."""
    job = session.scalar(select(Job).where(Job.idempotency_key == key))
    if job is None:
        return None
    if job.key_id != key_id:  # another key's job: say nothing of it
        message = f"Idempotency-Key {key!r} is taken; choose another"
        raise Invalid(("header", "Idempotency-Key"), message, "idempotency_key_reused")
    if job.request_hash != hashed:
        raise Invalid(
            ("header", "Idempotency-Key"),
            f"Idempotency-Key {key!r} was already used for job {job.id} with a different request body",
            "idempotency_key_reused",
        )
    return job


def find(session: Session, caller: Caller, job_id: str) -> Job:
    return caller.find(session, Job, job_id, job_live)


def get(service: Service, caller: Caller, job_id: str) -> Job:
    with service.sessions() as session:
        return find(session, caller, job_id)


def page(
    service: Service,
    caller: Caller,
    limit: int,
    after: str | None,
    statuses: list[JobStatus],
    metadata: dict[str, str],
    batch_id: str | None = None,
    key: str | None = None,
    model: str | None = None,
) -> tuple[list[Job], bool]:
    """Up to ``limit`` jobs older than the cursor ``after``, newest first, and whether more follow.

    ``key`` (a key's name or id) keeps that key's jobs; it narrows what the caller may see and never
    widens it, so a user key naming another key gets an empty page, as if that key had no jobs."""
    visible = (job_live(utcnow()), caller.owns(Job.key_id))
    query = select(Job).where(*visible).order_by(Job.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(Job.id < after)  # ids are time-ordered
    if batch_id is not None:
        query = query.where(Job.batch_id == batch_id)
    if key is not None:
        named = select(ApiKey.id).where(or_(ApiKey.id == key, ApiKey.name == key))
        query = query.where(Job.key_id.in_(named))
    if model is not None:
        query = query.where(Job.model == model)
    if statuses:
        query = query.where(Job.status.in_(statuses))
    for key, value in metadata.items():
        query = query.where(Job.meta[key].as_string() == value)
    with service.sessions() as session:
        jobs = list(session.scalars(query))
    return jobs[:limit], len(jobs) > limit


def cancel(service: Service, caller: Caller, job_id: str) -> tuple[Job, bool]:
    """Cancels a queued job at once (True); asks the worker running it to abort (False)."""
    with service.sessions() as session:
        find(session, caller, job_id)
        for _ in range(3):  # the job may move between the conditional updates (claimed, requeued)
            cancelled = {"status": JobStatus.CANCELLED, "finished_at": utcnow()}
            if _update_if(session, job_id, JobStatus.QUEUED, cancelled):
                job = _reload(session, job_id)
                deliveries = record_event(session, service.settings, "job.cancelled", job=job)
                session.commit()  # the cancellation and its webhook deliveries, together
                publish_deliveries(service.celery, deliveries)
                if service.announce_ended is not None:
                    service.announce_ended([job_id])
                return job, True
            if _update_if(session, job_id, JobStatus.RUNNING, {"cancel_requested": True}):
                session.commit()
                return _reload(session, job_id), False
            session.commit()
            job = _reload(session, job_id)
            if job.status in TERMINAL:
                raise Conflict(f"job {job_id} is already {job.status}; there is nothing to cancel")
    raise Conflict(f"job {job_id} kept changing state; retry the cancellation")


def delete(service: Service, caller: Caller, job_id: str) -> None:
    """Deletes an ended job with its token times, webhook deliveries and stream. An unfinished job is
    refused (cancel it first: its partial output is kept until it is deleted), and so is a line of a
    batch (delete the batch: its output files list every line)."""
    with service.sessions() as session:
        job = find(session, caller, job_id)
    if job.batch_id is not None:
        raise Conflict(f"job {job_id} is a line of batch {job.batch_id}; delete the batch instead")
    if job.status not in TERMINAL:
        raise Conflict(f"job {job_id} is {job.status}; cancel it first (POST /v1/jobs/{job_id}/cancel)")
    service.purger.jobs(select(Job.id).where(Job.id == job_id, Job.status.in_(TERMINAL)))


def _update_if(session: Session, job_id: str, status: JobStatus, values: dict[str, object]) -> bool:
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.status == status).values(values),
        execution_options={"synchronize_session": False},
    )
    return result.rowcount == 1  # type: ignore[attr-defined]


def _reload(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id, populate_existing=True)
    if job is None:
        raise NotFound("job", job_id)
    return job
