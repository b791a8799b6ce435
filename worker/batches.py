"""Batches end here: each reconcile round a worker expires batches past their window, stops what a
cancelled or expired batch still runs, estimates when the others will end (worker/estimates.py), and
finalizes batches whose jobs have all ended.

Finalizing: claim the batch (``in_progress | cancelling → finalizing``, a conditional UPDATE, so one
worker wins), write its output and error files, then in one transaction store them and move the batch
to ``completed``, ``cancelled`` or ``expired`` with its webhook event; publish the event after commit.
A finalization silent for ``stale_after`` seconds (its worker died) is claimed again.
"""

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from core.batches import cancel_unfinished
from core.models import Batch, File, Job, utcnow
from core.replay import batch_counts
from core.retention import deadline
from core.states import BatchStatus, JobStatus
from core.webhooks import Outbox
from worker.batch_output import result_files
from worker.estimates import Estimator

logger = logging.getLogger("pagedq.worker")
RUNNING_BATCH = (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)
OPEN_BATCH = (*RUNNING_BATCH, BatchStatus.FINALIZING)
UNFINISHED_JOB = (JobStatus.QUEUED, JobStatus.RUNNING)


@dataclass
class BatchKeeper:
    sessions: sessionmaker[Session]
    outbox: Outbox
    stale_after: float = 600.0

    def keep(self) -> None:
        if not self._any_open():
            return
        self.expire()
        self.stop_unfinished()
        self.estimate()
        self.finalize_done()

    def finalize_done(self) -> None:
        """Finalize every batch whose jobs have all ended (and take over finalizations presumed dead)."""
        for batch_id in self.ready():
            self.finalize(batch_id)

    def _any_open(self) -> bool:
        """Whether a batch runs or finalizes: with none (most rounds) one query instead of three."""
        with self.sessions.begin() as session:
            return session.scalar(select(Batch.id).where(Batch.status.in_(OPEN_BATCH)).limit(1)) is not None

    def expire(self) -> None:
        """Batches past ``expires_at`` get ``expired_at``, and their unfinished jobs are stopped."""
        now = utcnow()
        with self.sessions.begin() as session:
            expired = session.scalars(
                update(Batch)
                .where(
                    Batch.status == BatchStatus.IN_PROGRESS,
                    Batch.expired_at.is_(None),
                    Batch.expires_at < now,
                )
                .values(expired_at=now)
                .returning(Batch.id)
            ).all()
            cancel_unfinished(session, list(expired))
        for batch_id in expired:
            logger.info(
                "batch window ran out; its unfinished requests are cancelled", extra={"batch_id": batch_id}
            )

    def estimate(self) -> None:
        """Every running batch's estimated end; a ``batch.at_risk`` event for one newly late."""
        with self.sessions.begin() as session:
            deliveries = Estimator(self.outbox).estimate(session)
        self.outbox.publish(deliveries)

    def stop_unfinished(self) -> None:
        """Cancellation again for every cancelling or expired batch: a job requeued meanwhile stops too."""
        ending = or_(
            Batch.status == BatchStatus.CANCELLING,
            and_(Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_not(None)),
        )
        with self.sessions.begin() as session:
            cancel_unfinished(session, list(session.scalars(select(Batch.id).where(ending))))

    def ready(self) -> list[str]:
        """Running batches with no unfinished job left, and finalizations presumed dead."""
        unfinished = select(Job.id).where(Job.batch_id == Batch.id, Job.status.in_(UNFINISHED_JOB)).exists()
        query = select(Batch.id).where(or_(and_(Batch.status.in_(RUNNING_BATCH), ~unfinished), self._stale()))
        with self.sessions.begin() as session:
            return list(session.scalars(query.order_by(Batch.id)))

    def _stale(self) -> ColumnElement[bool]:
        since = utcnow() - timedelta(seconds=self.stale_after)
        return and_(Batch.status == BatchStatus.FINALIZING, Batch.finalizing_at < since)

    def finalize(self, batch_id: str) -> None:
        claimed = self._claim(batch_id)
        if claimed is None:
            return  # another worker finalizes it
        started = time.monotonic()
        with self.sessions.begin() as session:
            batch = session.get(Batch, batch_id, with_for_update=True)
            if batch is None or batch.status != BatchStatus.FINALIZING or batch.finalizing_at != claimed:
                return  # presumed dead and taken over meanwhile
            ending = _ending(batch)
            output, errors = result_files(session, batch, ending)
            now = utcnow()
            # The batch, its jobs and these files are kept from now (OpenAI's anchor: the output's creation).
            batch.retained_until = deadline(now, self.outbox.settings, batch.output_expires_after)
            batch.output_file_id = _store(session, batch, f"{batch_id}_output.jsonl", output)
            batch.error_file_id = _store(session, batch, f"{batch_id}_error.jsonl", errors)
            if batch.replay_of is not None:
                batch.replay_counts = batch_counts(session, batch_id)
            batch.status = ending
            setattr(batch, f"{ending.value}_at", now)
            session.flush()
            deliveries = self.outbox.record(session, f"batch.{ending.value}", batch=batch)
        self.outbox.publish(deliveries)
        logger.info(
            "batch finalized",
            extra={
                "batch_id": batch_id,
                "status": ending.value,
                "output_bytes": len(output),
                "error_bytes": len(errors),
                "seconds": round(time.monotonic() - started, 3),
            },
        )

    def _claim(self, batch_id: str) -> datetime | None:
        now = utcnow()
        statement = (
            update(Batch)
            .where(Batch.id == batch_id, or_(Batch.status.in_(RUNNING_BATCH), self._stale()))
            .values(status=BatchStatus.FINALIZING, finalizing_at=now)
            .returning(Batch.finalizing_at)
        )
        with self.sessions.begin() as session:
            return session.scalar(statement)


def _ending(batch: Batch) -> BatchStatus:
    if batch.cancelling_at is not None:
        return BatchStatus.CANCELLED
    if batch.expired_at is not None:
        return BatchStatus.EXPIRED
    return BatchStatus.COMPLETED


def _store(session: Session, batch: Batch, filename: str, content: bytes) -> str | None:
    """A ``batch_output`` file of the batch's key, kept as long as the batch, or None for no lines (OpenAI
    leaves the id null then)."""
    if not content:
        return None
    file = File(
        key_id=batch.key_id,
        purpose="batch_output",
        filename=filename,
        bytes=len(content),
        content=content,
        created_at=utcnow(),
        expires_at=batch.retained_until,
    )
    session.add(file)
    session.flush()
    return file.id
