"""Deleting what has expired (``core/retention.py``), a few hundred rows per transaction, so no lock is
held for long and a purge interrupted half way leaves nothing half deleted: each transaction deletes
whole jobs (their token-time chunks and webhook deliveries first), and a batch's own row and files go in
its last one, once its jobs are gone. A job's Redis stream goes after its row (it expires within an hour
anyway). Every worker's reconciler runs ``purge`` every ``PAGEDQ_PURGE_INTERVAL``; the API runs
``batch``/``jobs`` for ``DELETE``. Two purges at once delete the same rows twice: harmless."""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Select, delete, select
from sqlalchemy.orm import Session, sessionmaker

from core.models import Batch, File, Job, TokenTimes, WebhookDelivery, utcnow
from core.retention import batch_due, file_due, job_due

logger = logging.getLogger(__name__)
NO_SYNC = {"synchronize_session": False}
FILES_PER_JOB_CHUNK = 20  # a file may hold 200 MiB: a transaction deletes a twentieth as many


@dataclass
class Purger:
    sessions: sessionmaker[Session]
    chunk: int = 500
    drop_streams: Callable[[list[str]], None] | None = None  # deletes the jobs' Redis streams

    def purge(self, now: datetime | None = None) -> dict[str, int]:
        """Everything due at ``now``: lone jobs, batches (with their jobs and files), lone files."""
        now = now or utcnow()
        with self.sessions.begin() as session:
            batch_ids = list(session.scalars(select(Batch.id).where(batch_due(now))))
        counts = {
            "jobs": self.jobs(select(Job.id).where(job_due(now))),
            "batches": sum(self.batch(batch_id) for batch_id in batch_ids),
            "files": self.files(select(File.id).where(file_due(now))),
        }
        if any(counts.values()):
            logger.info("purged what had expired", extra=counts)
        return counts

    def jobs(self, ids: Select[tuple[str]]) -> int:
        """Deletes the jobs ``ids`` selects, ``chunk`` per transaction; how many."""
        deleted = 0
        while chunk := self._next(ids.limit(self.chunk)):
            with self.sessions.begin() as session:
                session.execute(
                    delete(TokenTimes).where(TokenTimes.job_id.in_(chunk)), execution_options=NO_SYNC
                )
                of_jobs = WebhookDelivery.job_id.in_(chunk)
                session.execute(delete(WebhookDelivery).where(of_jobs), execution_options=NO_SYNC)
                session.execute(delete(Job).where(Job.id.in_(chunk)), execution_options=NO_SYNC)
            if self.drop_streams is not None:
                self.drop_streams(chunk)
            deleted += len(chunk)
        return deleted

    def batch(self, batch_id: str) -> int:
        """A batch: its jobs, then its row, deliveries and output and error files; 1 if it was there."""
        self.jobs(select(Job.id).where(Job.batch_id == batch_id))
        with self.sessions.begin() as session:
            batch = session.get(Batch, batch_id)
            if batch is None:
                return 0
            files = [batch.output_file_id, batch.error_file_id]
            session.execute(
                delete(WebhookDelivery).where(WebhookDelivery.batch_id == batch_id), execution_options=NO_SYNC
            )
            session.delete(batch)
            session.flush()
            session.execute(
                delete(File).where(File.id.in_([f for f in files if f])), execution_options=NO_SYNC
            )
        return 1

    def files(self, ids: Select[tuple[str]]) -> int:
        deleted = 0
        while chunk := self._next(ids.limit(max(self.chunk // FILES_PER_JOB_CHUNK, 1))):
            with self.sessions.begin() as session:
                session.execute(delete(File).where(File.id.in_(chunk)), execution_options=NO_SYNC)
            deleted += len(chunk)
        return deleted

    def _next(self, ids: Select[tuple[str]]) -> list[str]:
        with self.sessions.begin() as session:
            return list(session.scalars(ids))
