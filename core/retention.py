"""How long jobs, batches and files are kept, and the one rule that says when one has expired.

A job or file is kept ``PAGEDQ_RETENTION_DAYS`` from its creation (a file may ask for its own time with
OpenAI's ``expires_after``); a batch, its jobs and its output and error files are kept for the batch's
``output_expires_after`` (default the same days) from when its output is written, as OpenAI anchors it
at the output file's creation. Nothing expires before it has ended: a queued or running job and a batch
still in progress are kept whatever their deadline says.

From its deadline on, an object is missing to every lookup of the API (404), through the ``*_live``
conditions below; ``core/purge.py`` deletes it later, in small transactions, with the ``*_due`` ones.
"""

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, not_, or_, select

from core.models import Batch, File, Job
from core.settings import Settings
from core.states import TERMINAL

MIN_SECONDS, MAX_SECONDS = 3600, 30 * 86400  # OpenAI's bounds for expires_after / output_expires_after


def deadline(start: datetime, settings: Settings, seconds: int | None = None) -> datetime | None:
    """When an object that starts counting at ``start`` expires: after ``seconds`` if it asked for its
    own time, else after the global retention; None when retention is off (``PAGEDQ_RETENTION_DAYS=0``)."""
    if seconds is not None:
        return start + timedelta(seconds=seconds)
    return start + timedelta(days=settings.retention_days) if settings.retention_days > 0 else None


def batch_due(now: datetime) -> ColumnElement[bool]:
    """``retained_until`` is set only when a batch ends, so a batch in progress is never due."""
    return Batch.retained_until <= now


def batch_live(now: datetime) -> ColumnElement[bool]:
    return or_(Batch.retained_until.is_(None), Batch.retained_until > now)


def job_due(now: datetime) -> ColumnElement[bool]:
    """A job past its own deadline that has ended; a batch's jobs go with their batch instead."""
    return and_(Job.expires_at <= now, Job.status.in_(TERMINAL), Job.batch_id.is_(None))


def job_live(now: datetime) -> ColumnElement[bool]:
    own = or_(Job.expires_at.is_(None), Job.expires_at > now, Job.status.not_in(TERMINAL))
    batch_gone = exists(select(Batch.id).where(Batch.id == Job.batch_id, batch_due(now)))
    return and_(own, not_(batch_gone))


def file_due(now: datetime) -> ColumnElement[bool]:
    """An expired file no batch uses (a batch's files go with the batch)."""
    uses = or_(
        Batch.input_file_id == File.id, Batch.output_file_id == File.id, Batch.error_file_id == File.id
    )
    return and_(File.expires_at <= now, not_(exists(select(Batch.id).where(uses))))


def file_live(now: datetime) -> ColumnElement[bool]:
    return or_(File.expires_at.is_(None), File.expires_at > now)
