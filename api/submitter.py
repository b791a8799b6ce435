"""Group commit for submissions: jobs that arrive together share one INSERT and one COMMIT.

Under load the API's cost per job is dominated by a transaction per request; here one drain task
commits whatever has queued up while the previous batch was being written, then publishes each id. An
idle API still commits a lone job at once. The batch's messages go out in one broker round trip. A job
is answered only after its row is committed and its message is published (or its publish failed, which
the worker's reconciler repairs).
"""

import asyncio
import logging
from collections import defaultdict

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from core.models import Job
from core.queue import publish_jobs

logger = logging.getLogger(__name__)
MAX_BATCH = 256


class Submitter:
    def __init__(self, sessions: sessionmaker[Session], celery: Celery, queue: str) -> None:
        self._sessions, self._celery, self._queue = sessions, celery, queue
        self._pending: list[tuple[Job, asyncio.Future[None]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, job: Job) -> None:
        """Returns once ``job`` is committed and published; raises what committing it raised."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append((job, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                await run_in_threadpool(self._write, [job for job, _ in batch])
            except Exception as error:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(error)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    def _write(self, jobs: list[Job]) -> None:
        with self._sessions() as session:
            session.add_all(jobs)
            session.commit()
        self.publish(jobs)

    def publish(self, jobs: list[Job]) -> None:
        """Publish committed jobs' ids; a failure is logged, not raised: the jobs are safe in the database."""
        by_priority: dict[int, list[str]] = defaultdict(list)
        for job in jobs:
            by_priority[job.priority].append(job.id)
        for priority, job_ids in by_priority.items():
            try:
                publish_jobs(self._celery, job_ids, self._queue, priority)
            except Exception as error:  # the worker's reconciler republishes queued jobs without a message
                logger.warning(
                    "jobs are queued; publishing failed (they will be republished)",
                    extra={"job_ids": job_ids[:10], "jobs": len(job_ids), "error": str(error)},
                )
