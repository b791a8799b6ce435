"""The queries behind ``/v1/batches``: accept a file as one batch of jobs, read, list and cancel batches.

Accepting is one pass over the file (``api/batch_check.py``): the batch row and its jobs are written in
one transaction (one COPY) as the lines are checked, and committed only if every line is good; their
ids are then published in the background (``api/bulk_publisher.py``). A file with any bad line rolls
that back and becomes a ``failed`` batch listing every bad line, with no job.
"""

import logging
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.batch_check import BadLines, CheckedLine
from api.batch_lines import LineError
from api.bulk_insert import insert_jobs
from api.deps import Service
from api.jobs import check_webhook_url
from api.openai_schemas import BatchIn, BatchOut
from api.problems import Conflict, Invalid, NotFound, Unavailable
from core.batches import cancel_unfinished, tally
from core.models import FRESH_RESULTS, Batch, File, new_batch_id, utcnow
from core.states import BATCH_TERMINAL, BatchStatus, JobStatus
from core.webhooks import publish_deliveries, record_event

logger = logging.getLogger(__name__)
MAX_LISTED_ERRORS = 1000
FRESH = {"attempt": 0, "cancel_requested": False} | FRESH_RESULTS  # a COPY sets every NOT NULL column


def create(service: Service, request: BatchIn) -> BatchOut:
    started = time.monotonic()
    content = _input_file(service, request.input_file_id)
    if request.webhook_url is not None:
        check_webhook_url(service, str(request.webhook_url))
    batch = _new_batch(service, request)
    lines = service.batch_checker.check(content, request.endpoint, service.settings.served_model_name)
    try:
        _start(service, batch, lines)
    except BadLines as bad:
        _fail(service, batch, bad.errors)
    except BrokenProcessPool:
        raise Unavailable("a process checking the file's lines died; retry the request") from None
    logger.info(
        "batch created",
        extra={
            "batch_id": batch.id,
            "status": batch.status,
            "lines": batch.total,
            "bad_lines": len(batch.errors or []),
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return get(service, batch.id)


def _input_file(service: Service, file_id: str) -> bytes:
    with service.sessions() as session:
        row = session.execute(select(File.purpose, File.content).where(File.id == file_id)).one_or_none()
    if row is None:
        raise NotFound("file", file_id)
    if row.purpose != "batch":
        message = (
            f"file {file_id!r} has purpose {row.purpose!r}; a batch reads a file uploaded with purpose=batch"
        )
        raise Invalid(("body", "input_file_id"), message, "invalid_file_purpose")
    return row.content


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
    batch.in_progress_at, batch.total = None, 0
    with service.sessions.begin() as session:
        session.add(batch)
        session.flush()
        deliveries = record_event(session, service.settings, "batch.failed", batch=batch)
    publish_deliveries(service.celery, deliveries)


def _start(service: Service, batch: Batch, lines: Iterable[CheckedLine]) -> None:
    """The batch and a job per line, committed once the last line is checked (``BadLines`` rolls all
    back). Job ids count up in input order (time, a random part, then the line's number), so ordering a
    batch's jobs by id gives its lines in order."""
    batch.status, batch.in_progress_at = BatchStatus.IN_PROGRESS, batch.created_at
    prefix = f"job_{int(batch.created_at.timestamp() * 1000):012x}{os.urandom(4).hex()}"
    ids: list[str] = []
    with service.sessions.begin() as session:
        session.add(batch)
        session.flush()
        insert_jobs(session, _shared_by_jobs(batch), _job_rows(prefix, lines, ids))
        batch.total = len(ids)
    service.bulk_publisher.publish(ids, batch.priority)


def _shared_by_jobs(batch: Batch) -> dict[str, Any]:
    return {
        "status": JobStatus.QUEUED.value,
        "model": batch.model,
        "priority": batch.priority,
        "batch_id": batch.id,
        "endpoint": batch.endpoint,
        "queued_at": batch.created_at,
        "published_at": batch.created_at,
    } | FRESH


def _job_rows(prefix: str, lines: Iterable[CheckedLine], ids: list[str]) -> Iterator[dict[str, Any]]:
    """One job per line, made as the insert takes them; their ids are appended to ``ids``."""
    for line in lines:
        ids.append(job_id := f"{prefix}{line.number:012x}")
        yield {
            "id": job_id,
            "prompt": line.prompt,
            "messages": line.messages,
            "prompt_token_ids": line.prompt_token_ids,
            "prompt_tokens": len(line.prompt_token_ids),
            "params": line.params,
            "meta": line.meta,
            "custom_id": line.custom_id,
        }


def get(service: Service, batch_id: str) -> BatchOut:
    with service.sessions() as session:
        batch = session.get(Batch, batch_id)
        if batch is None:
            raise NotFound("batch", batch_id)
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
        raise Conflict(f"batch {batch_id} is already {batch.status}; there is nothing to cancel")
    return batch


def _start_cancelling(session: Session, batch_id: str) -> bool:
    """False when the batch is not in progress, or its window has run out (it is ending as expired)."""
    statement = (
        update(Batch)
        .where(Batch.id == batch_id, Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_(None))
        .values(status=BatchStatus.CANCELLING, cancelling_at=utcnow())
    )
    return session.execute(statement, execution_options={"synchronize_session": False}).rowcount == 1
