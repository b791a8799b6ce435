"""The queries behind ``/v1/batches``: accept a file as one batch of jobs, read, list and cancel batches.

Accepting is one pass over the file: every line is checked and its prompt tokenized (the tokenizer's
batch encode) before anything is written. A file with any bad line becomes a ``failed`` batch listing
every bad line and creates no job. A good one becomes the batch row and all its jobs in one transaction
(one COPY), whose ids are then published in the background (``api/bulk_publisher.py``).
"""

import logging
import os
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from fastapi import HTTPException
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.batch_lines import Line, LineError, read_lines
from api.bulk_insert import insert_jobs
from api.deps import Service
from api.errors import invalid
from api.files import file_not_found
from api.jobs import check_webhook_url
from api.openai_schemas import BatchIn, BatchOut
from api.prompts import ContextExceeded, PromptError
from core.batches import cancel_unfinished, tally
from core.models import Batch, File, new_batch_id, utcnow
from core.states import BATCH_TERMINAL, BatchStatus, JobStatus
from core.webhooks import publish_deliveries, record_event

logger = logging.getLogger(__name__)
MAX_LISTED_ERRORS = 1000
FRESH = {
    "attempt": 0,
    "cancel_requested": False,
    "output_text": "",
    "completion_tokens": 0,
    "cached_tokens": 0,
    "token_times_ms": [],
}


def batch_not_found(batch_id: str) -> HTTPException:
    return HTTPException(404, f"batch {batch_id!r} not found")


def create(service: Service, request: BatchIn) -> BatchOut:
    started = time.monotonic()
    content = _input_file(service, request.input_file_id)
    if request.webhook_url is not None:
        check_webhook_url(service, str(request.webhook_url))
    lines, errors = read_lines(content, request.endpoint, service.settings.served_model_name)
    token_ids = _encode(service, lines, errors)
    batch = _new_batch(service, request)
    if errors:
        _fail(service, batch, sorted(errors, key=lambda e: e.line or 0))
    else:
        _start(service, batch, lines, token_ids)
    logger.info(
        "batch created",
        extra={
            "batch_id": batch.id,
            "status": batch.status,
            "lines": len(lines) + len(errors),
            "bad_lines": len(errors),
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return get(service, batch.id)


def _input_file(service: Service, file_id: str) -> bytes:
    with service.sessions() as session:
        row = session.execute(select(File.purpose, File.content).where(File.id == file_id)).one_or_none()
    if row is None:
        raise file_not_found(file_id)
    if row.purpose != "batch":
        message = (
            f"file {file_id!r} has purpose {row.purpose!r}; a batch reads a file uploaded with purpose=batch"
        )
        raise invalid(("body", "input_file_id"), message, "invalid_file_purpose")
    return row.content


def _encode(service: Service, lines: list[Line], errors: list[LineError]) -> list[list[int]]:
    """Each line's prompt token ids (empty for a line that cannot run: its error joins ``errors``).

    A line without max_tokens gets what is left of the context after its prompt, as OpenAI's API does.
    """
    results = service.prompts.encode_many([line.spec for line in lines])
    token_ids = []
    for line, result in zip(lines, results, strict=True):
        if isinstance(result, PromptError):
            code = "context_length_exceeded" if isinstance(result, ContextExceeded) else "invalid_prompt"
            errors.append(LineError(line.number, code, str(result), f"body.{result.field}"))
            result = []
        elif line.fills_context:
            line.spec.max_tokens = service.prompts.context_length - len(result)
        token_ids.append(result)
    return token_ids


def _new_batch(service: Service, request: BatchIn) -> Batch:
    now = utcnow()
    return Batch(
        id=new_batch_id(),
        endpoint=request.endpoint,
        model=service.settings.served_model_name,
        input_file_id=request.input_file_id,
        completion_window=request.completion_window,
        meta=request.metadata,
        priority=request.priority,
        webhook_url=str(request.webhook_url) if request.webhook_url else None,
        webhook_events=request.webhook_events,
        created_at=now,
        expires_at=now + request.window,
    )


def _fail(service: Service, batch: Batch, errors: list[LineError]) -> None:
    listed = [error.as_json() for error in errors[:MAX_LISTED_ERRORS]]
    if len(errors) > MAX_LISTED_ERRORS:
        more = f"{len(errors) - MAX_LISTED_ERRORS} more lines have errors, not listed"
        listed.append(LineError(None, "too_many_errors", more).as_json())
    batch.status, batch.failed_at, batch.errors = BatchStatus.FAILED, batch.created_at, listed
    with service.sessions.begin() as session:
        session.add(batch)
        session.flush()
        deliveries = record_event(session, service.settings, "batch.failed", batch=batch)
    publish_deliveries(service.celery, deliveries)


def _start(service: Service, batch: Batch, lines: list[Line], token_ids: list[list[int]]) -> None:
    batch.status, batch.in_progress_at, batch.total = BatchStatus.IN_PROGRESS, batch.created_at, len(lines)
    ids = _job_ids(batch, len(lines))
    with service.sessions.begin() as session:
        session.add(batch)
        session.flush()
        insert_jobs(session, _job_rows(batch, ids, lines, token_ids))
    service.bulk_publisher.publish(ids, batch.priority)


def _job_ids(batch: Batch, count: int) -> list[str]:
    """Ids that count up in input order (time, a random part, then the line's index), so ordering a
    batch's jobs by id gives its lines in order."""
    prefix = f"job_{int(batch.created_at.timestamp() * 1000):012x}{os.urandom(4).hex()}"
    return [f"{prefix}{index:012x}" for index in range(count)]


def _job_rows(
    batch: Batch, job_ids: list[str], lines: list[Line], token_ids: list[list[int]]
) -> Iterator[dict[str, Any]]:
    """One job per line, made as the insert takes them."""
    now: datetime = batch.created_at
    common = {
        "status": JobStatus.QUEUED.value,
        "model": batch.model,
        "priority": batch.priority,
        "batch_id": batch.id,
        "endpoint": batch.endpoint,
        "queued_at": now,
        "published_at": now,
    } | FRESH
    return (
        {
            "id": job_id,
            "prompt": line.spec.prompt,
            "messages": [m.model_dump() for m in line.spec.messages] if line.spec.messages else None,
            "prompt_token_ids": prompt_ids,
            "prompt_tokens": len(prompt_ids),
            "params": line.spec.engine_params(),
            "meta": line.spec.metadata,
            "custom_id": line.custom_id,
            **common,
        }
        for job_id, line, prompt_ids in zip(job_ids, lines, token_ids, strict=True)
    )


def get(service: Service, batch_id: str) -> BatchOut:
    with service.sessions() as session:
        batch = session.get(Batch, batch_id)
        if batch is None:
            raise batch_not_found(batch_id)
        return BatchOut.of(batch, tally(session, [batch_id])[batch_id])


def page(service: Service, limit: int, after: str | None) -> tuple[list[BatchOut], bool]:
    """Up to ``limit`` batches older than the cursor ``after``, newest first, and whether more follow."""
    query = select(Batch).order_by(Batch.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(Batch.id < after)  # ids are time-ordered
    with service.sessions() as session:
        found = list(session.scalars(query))
        tallies = tally(session, [batch.id for batch in found[:limit]])
        return [BatchOut.of(batch, tallies[batch.id]) for batch in found[:limit]], len(found) > limit


def cancel(service: Service, batch_id: str) -> BatchOut:
    """An in-progress batch turns ``cancelling``: its queued jobs are cancelled at once, its running ones
    asked to stop; a worker finalizes it as ``cancelled`` when all have ended, keeping finished results."""
    with service.sessions.begin() as session:
        if cancelling := _start_cancelling(session, batch_id):
            cancel_unfinished(session, [batch_id])
    batch = get(service, batch_id)
    if not cancelling and batch.status in (*BATCH_TERMINAL, BatchStatus.FINALIZING):
        raise HTTPException(409, f"batch {batch_id} is already {batch.status}; there is nothing to cancel")
    return batch


def _start_cancelling(session: Session, batch_id: str) -> bool:
    """False when the batch is not in progress, or its window has run out (it is ending as expired)."""
    statement = (
        update(Batch)
        .where(Batch.id == batch_id, Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_(None))
        .values(status=BatchStatus.CANCELLING, cancelling_at=utcnow())
    )
    return session.execute(statement, execution_options={"synchronize_session": False}).rowcount == 1
