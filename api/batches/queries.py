"""The queries behind ``/v1/batches``: accept a file as one batch of jobs, read, list and cancel batches.

Accepting is one pass over the file (``api/batches/check.py``): the batch row and its jobs are written in
one transaction (one COPY) as the lines are checked, and committed only if every line is good; their
ids are then published in the background (``api/batches/bulk_publisher.py``). A file with any bad line rolls
that back and becomes a ``failed`` batch listing every bad line, with no job.
"""

import logging
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, raiseload

from api.batches.bulk_insert import insert_jobs
from api.batches.check import BadLines, CheckedLine
from api.batches.embedding_lines import check_embedding_lines
from api.batches.lines import EMBEDDINGS, BatchModel, LineError, first_model
from api.batches.schemas import BatchIn, BatchOut
from api.deps import Service
from api.files.queries import find as find_file
from api.http.caller import Caller
from api.http.limits import check_active, check_sizes, hold_keys
from api.http.problems import Conflict, Invalid, Unavailable
from api.jobs.queries import check_webhook_url, replayed
from api.prompts.encoder import job_prefix_key
from core.batches import cancel_unfinished, tally
from core.models import FRESH_RESULTS, Batch, File, Job, new_batch_id, utcnow
from core.retention import batch_live, deadline, file_due
from core.settings import Settings
from core.states import BATCH_TERMINAL, BatchStatus, JobStatus
from core.webhooks import publish_deliveries, record_event
from core.windows import window_length

logger = logging.getLogger(__name__)
MAX_LISTED_ERRORS = 1000
FRESH = {"attempt": 0, "cancel_requested": False} | FRESH_RESULTS  # a COPY sets every NOT NULL column


def create(service: Service, caller: Caller, request: BatchIn) -> BatchOut:
    """The caller's key owns the batch, its jobs and its files; a batch that would take the key past its
    max_active_jobs is refused whole (429), and one submission counts against its requests_per_second."""
    started = time.monotonic()
    service.limiter.request(caller)
    content = _input_file(service, caller, request.input_file_id)
    if request.webhook_url is not None:
        check_webhook_url(service, str(request.webhook_url))
    batch = _new_batch(service, request)
    batch.key_id = caller.key_id
    try:
        rows = _job_rows(service.settings, caller, batch, _lines(service, batch, content))
        _start(service, caller, batch, rows)
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
    return get(service, caller, batch.id)


def _lines(service: Service, batch: Batch, content: bytes) -> Iterable[CheckedLine]:
    """The file's lines, checked as they are taken (``BadLines`` if any is bad; an embeddings file's, all
    at once), and the batch's one model set: its first line's (an embeddings file's must name one)."""
    if batch.endpoint == EMBEDDINGS:
        batch.model, lines = check_embedding_lines(service.models, content)
        return lines
    named = first_model(content)  # a batch runs one model; a line naming an unserved one is a bad line
    model = service.models.generating(named if named in service.models.names else None).name
    batch.model = model
    return service.models.checker(model).check(
        content, batch.endpoint, BatchModel(model, tuple(service.models.names))
    )


def _input_file(service: Service, caller: Caller, file_id: str) -> bytes:
    with service.sessions() as session:
        row = find_file(session, caller, file_id, with_content=True)
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
        input_file_id=request.input_file_id,
        completion_window=request.completion_window,
        meta=request.metadata,
        priority=service.settings.batch_priority if request.priority is None else request.priority,
        webhook_url=str(request.webhook_url) if request.webhook_url else None,
        webhook_events=request.webhook_events,
        created_at=now,
        expires_at=now + request.window,
        output_expires_after=request.output_expires_after.seconds if request.output_expires_after else None,
    )


def _fail(service: Service, batch: Batch, errors: list[LineError]) -> None:
    listed = [error.as_json() for error in errors[:MAX_LISTED_ERRORS]]
    if len(errors) > MAX_LISTED_ERRORS:
        more = f"{len(errors) - MAX_LISTED_ERRORS} more lines have errors, not listed"
        listed.append(LineError(None, "too_many_errors", more).as_json())
    batch.status, batch.failed_at, batch.errors = BatchStatus.FAILED, batch.created_at, listed
    batch.in_progress_at, batch.total = None, 0
    batch.retained_until = deadline(batch.created_at, service.settings, batch.output_expires_after)
    with service.sessions.begin() as session:
        session.add(batch)
        session.flush()
        deliveries = record_event(session, service.settings, "batch.failed", batch=batch)
    publish_deliveries(service.celery, deliveries)


def _start(service: Service, caller: Caller, batch: Batch, rows: Iterable[dict[str, Any]]) -> None:
    """The batch and its jobs (``rows``: their own columns, made as the insert takes them), committed once
    the last is made (``BadLines`` rolls all back)."""
    batch.status, batch.in_progress_at = BatchStatus.IN_PROGRESS, batch.created_at
    ids: list[str] = []
    with service.sessions.begin() as session:
        session.add(batch)
        session.flush()
        insert_jobs(session, _shared_by_jobs(batch), _noting_ids(rows, ids))
        batch.total = len(ids)
        if caller.key_id is not None and caller.limits is not None:
            hold_keys(session, [caller.key_id])  # counted after every other submission of the key
        check_active(session, caller, batch.total, inserted=True)  # refused: all of it rolls back
    service.bulk_publisher.publish(ids, service.models.queue(batch.model), batch.priority)


def _shared_by_jobs(batch: Batch) -> dict[str, Any]:
    return {
        "status": JobStatus.QUEUED.value,
        "model": batch.model,
        "priority": batch.priority,
        "batch_id": batch.id,
        "key_id": batch.key_id,
        "endpoint": batch.endpoint,
        "queued_at": batch.created_at,
        "published_at": batch.created_at,
        "deadline_at": batch.expires_at,  # its completion_window: the earliest runs first among equals
    } | FRESH


def _noting_ids(rows: Iterable[dict[str, Any]], ids: list[str]) -> Iterator[dict[str, Any]]:
    for row in rows:
        ids.append(row["id"])
        yield row


def _id_prefix(batch: Batch) -> str:
    """Job ids count up in input order (time, a random part, then the line's number), so ordering a
    batch's jobs by id gives its lines in order."""
    return f"job_{int(batch.created_at.timestamp() * 1000):012x}{os.urandom(4).hex()}"


def _job_rows(
    settings: Settings, caller: Caller, batch: Batch, lines: Iterable[CheckedLine]
) -> Iterator[dict[str, Any]]:
    """One job per line. A line over the key's size limits refuses the batch (422; the transaction rolls
    back)."""
    prefix = _id_prefix(batch)
    for line in lines:
        if caller.limits is not None:
            params, tokens = line.params, _longest(line.prompt_token_ids)
            n = max(params.get("n", 1), params.get("best_of") or 0)
            check_sizes(
                caller.limits, tokens, params.get("max_tokens", 0), n, ("body", f"line {line.number}")
            )
        yield {
            "id": f"{prefix}{line.number:012x}",
            "prompt": line.prompt,
            "messages": line.messages,
            "prompt_token_ids": line.prompt_token_ids,
            "prompt_tokens": _tokens(line.prompt_token_ids),
            "params": line.params,
            "meta": line.meta,
            "custom_id": line.custom_id,
            "prefix_key": job_prefix_key(settings, line.prompt_token_ids),
        }


def replay(service: Service, caller: Caller, batch_id: str) -> BatchOut:
    """A new batch replaying every line of an ended batch: each line's job asks what the original line's
    asked, with its seed (``replayed``, as a job's replay does). Once it ends, its ``replay`` counts the
    lines identical to their originals. It counts against the caller's key as a new batch does."""
    service.limiter.request(caller)
    with service.sessions() as session:
        original = find(session, caller, batch_id)
    if original.status not in BATCH_TERMINAL:
        message = f"batch {batch_id} is {original.status}; replay it once it has ended"
        raise Conflict(message)
    if not original.total:
        raise Conflict(f"batch {batch_id} has no lines to replay: it {original.status} before any ran")
    model = service.models.generating(original.model).name  # still served, and not an embedding model
    batch = _replay_batch(original, model)
    batch.key_id = caller.key_id
    with service.sessions() as reading:  # its own connection: the insert's is busy with its COPY
        query = select(Job).options(raiseload("*")).where(Job.batch_id == batch_id).order_by(Job.id)
        lines = reading.scalars(query.execution_options(yield_per=1000))
        _start(service, caller, batch, _replay_rows(batch, lines))
    return get(service, caller, batch.id)


def _replay_batch(original: Batch, model: str) -> Batch:
    now = utcnow()
    return Batch(
        id=new_batch_id(),
        endpoint=original.endpoint,
        model=model,
        input_file_id=original.input_file_id,  # the same lines
        completion_window=original.completion_window,
        meta=original.meta,
        priority=original.priority,
        webhook_url=original.webhook_url,
        webhook_events=original.webhook_events,
        created_at=now,
        expires_at=now + window_length(original.completion_window),
        output_expires_after=original.output_expires_after,
        replay_of=original.id,
    )


def _replay_rows(batch: Batch, originals: Iterable[Job]) -> Iterator[dict[str, Any]]:
    prefix = _id_prefix(batch)
    for number, original in enumerate(originals):
        yield {"id": f"{prefix}{number:012x}", "custom_id": original.custom_id} | replayed(original)


def _tokens(token_ids: list[int] | list[list[int]]) -> int:
    """A prompt's tokens, or all an embedding line's inputs' tokens."""
    return sum(map(len, token_ids)) if token_ids and isinstance(token_ids[0], list) else len(token_ids)  # type: ignore[arg-type]


def _longest(token_ids: list[int] | list[list[int]]) -> int:
    """A prompt's tokens, or an embedding line's longest input's: what a key's max_prompt_tokens limits."""
    return max(map(len, token_ids)) if token_ids and isinstance(token_ids[0], list) else len(token_ids)  # type: ignore[arg-type]


def find(session: Session, caller: Caller, batch_id: str) -> Batch:
    return caller.find(session, Batch, batch_id, batch_live)


def get(service: Service, caller: Caller, batch_id: str) -> BatchOut:
    with service.sessions() as session:
        batch = find(session, caller, batch_id)
        return BatchOut.of(batch, tally(session, [batch_id])[batch_id])


def page(service: Service, caller: Caller, limit: int, after: str | None) -> tuple[list[BatchOut], bool]:
    """Up to ``limit`` batches older than the cursor ``after``, newest first, and whether more follow."""
    visible = (batch_live(utcnow()), caller.owns(Batch.key_id))
    query = select(Batch).where(*visible).order_by(Batch.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(Batch.id < after)  # ids are time-ordered
    with service.sessions() as session:
        found = list(session.scalars(query))
        tallies = tally(session, [batch.id for batch in found[:limit]])
        return [BatchOut.of(batch, tallies[batch.id]) for batch in found[:limit]], len(found) > limit


def cancel(service: Service, caller: Caller, batch_id: str) -> BatchOut:
    """An in-progress batch turns ``cancelling``: its queued jobs are cancelled at once, its running ones
    asked to stop; a worker finalizes it as ``cancelled`` when all have ended, keeping finished results."""
    with service.sessions.begin() as session:
        find(session, caller, batch_id)
        if cancelling := _start_cancelling(session, batch_id):
            cancel_unfinished(session, [batch_id])
    batch = get(service, caller, batch_id)
    if not cancelling and batch.status in (*BATCH_TERMINAL, BatchStatus.FINALIZING):
        raise Conflict(f"batch {batch_id} is already {batch.status}; there is nothing to cancel")
    return batch


def delete(service: Service, caller: Caller, batch_id: str) -> None:
    """Deletes an ended batch with its jobs, webhook deliveries, output and error files, and its input
    file unless another batch reads it. Missing at once; deleted in small transactions, which the
    worker's purge finishes if this is interrupted. A batch still running is refused: cancel it first."""
    now = utcnow()
    with service.sessions.begin() as session:
        batch = find(session, caller, batch_id)
        if batch.status not in BATCH_TERMINAL:
            message = (
                f"batch {batch_id} is {batch.status}; cancel it first (POST /v1/batches/{batch_id}/cancel)"
            )
            raise Conflict(message)
        batch.retained_until = now
        input_file = batch.input_file_id
        shared = select(Batch.id).where(Batch.input_file_id == input_file, Batch.id != batch_id).exists()
        session.execute(
            update(File).where(File.id == input_file, ~shared).values(expires_at=now),
            execution_options={"synchronize_session": False},
        )
    service.purger.batch(batch_id)
    service.purger.files(select(File.id).where(File.id == input_file, file_due(now)))


def _start_cancelling(session: Session, batch_id: str) -> bool:
    """False when the batch is not in progress, or its window has run out (it is ending as expired)."""
    statement = (
        update(Batch)
        .where(Batch.id == batch_id, Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_(None))
        .values(status=BatchStatus.CANCELLING, cancelling_at=utcnow())
    )
    return session.execute(statement, execution_options={"synchronize_session": False}).rowcount == 1
