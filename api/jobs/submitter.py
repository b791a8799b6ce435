"""Group commit for submissions: jobs that arrive together share one INSERT and one COMMIT.

Under load the API's cost per job is dominated by a transaction per request; here one drain task
commits whatever has queued up while the previous batch was being written, then publishes each id. An
idle API still writes a lone job at once (one INSERT in autocommit, when no key limit is counted). The
batch's messages go out in one broker round trip. A job is answered only after its row is committed and
its message is published (or its publish failed, which the worker's reconciler repairs). If a shared
write fails, its jobs are written again one by one, so one job the database refuses fails alone (a 422
when it is the job's values, else the fault as it is).

The write holds the keys of its jobs that have a ``max_active_jobs`` and counts their active jobs in
the same transaction (``api/http/limits.py``): a job past its key's limit is refused (429) and not
written.
"""

import asyncio
import logging
from collections import defaultdict
from typing import NamedTuple

from celery import Celery
from sqlalchemy import insert
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.http.caller import OPEN, Caller
from api.http.limits import admit, counted
from api.http.problems import Invalid, TooMany
from core.db import autocommitting
from core.models import Job
from core.queue import publish_jobs, queue_name
from core.spec import escaped

logger = logging.getLogger(__name__)
MAX_BATCH = 256


# Core's, not the ORM's: a job is written as a row (``Job.insertable``), without the ORM's bulk insert.
NEW_JOBS = insert(Job.__table__)


class Member(NamedTuple):
    job: Job
    caller: Caller
    done: asyncio.Future[None]


class Submitter:
    def __init__(self, sessions: sessionmaker[Session], celery: Celery) -> None:
        self._sessions, self._celery = sessions, celery
        self._pending: list[Member] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, job: Job, caller: Caller = OPEN) -> None:
        """Returns once ``job`` is committed and published; raises what committing it raised, or
        ``TooMany`` when its key (``caller``) is at its max_active_jobs."""
        done = asyncio.get_running_loop().create_future()
        self._pending.append(Member(job, caller, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            try:
                refused = await run_in_threadpool(self._write, batch)
            except OperationalError as error:  # the database is down: each would fail alike
                _settle(batch, error)
            except Exception as error:
                if len(batch) == 1:
                    _settle(batch, _as_client_error(error))
                    continue
                logger.warning(
                    "a group commit failed; writing its jobs one by one",
                    extra={"jobs": len(batch), "error": _first_line(error)},
                )
                for member in batch:  # only the job at fault fails
                    await self._write_alone(member)
            else:
                _settle_each(batch, refused)

    async def _write_alone(self, member: Member) -> None:
        try:
            refused = await run_in_threadpool(self._write, [member])
        except Exception as error:
            _settle([member], _as_client_error(error))
        else:
            _settle_each([member], refused)

    def _write(self, members: list[Member]) -> dict[int, TooMany]:
        """Writes and publishes the members' jobs but those past their key's limit: refused, by index."""
        # Nothing to count and one INSERT: its own transaction, without the BEGIN and COMMIT round trips
        # before the message can go out (an idle API's lone job, a streamed request's).
        alone = len(members) == 1 and not counted(members[0].caller)
        with self._sessions() as session:
            if alone:
                autocommitting(session)  # the session's statements run on it
            refused = admit(session, [m.caller for m in members])
            jobs = [m.job for i, m in enumerate(members) if i not in refused]
            if jobs:
                session.connection().execute(NEW_JOBS, [job.insertable() for job in jobs])
            if not alone:
                session.commit()
        self.publish(jobs)
        return refused

    def publish(self, jobs: list[Job]) -> None:
        """Publish committed jobs' ids, each to its model's queue; a failure is logged, not raised: the jobs
        are safe in the database."""
        by_queue: dict[tuple[str, int], list[str]] = defaultdict(list)
        for job in jobs:
            by_queue[queue_name(job.model), job.priority].append(job.id)
        for (queue, priority), job_ids in by_queue.items():
            try:
                publish_jobs(self._celery, job_ids, queue, priority)
            except Exception as error:  # the worker's reconciler republishes queued jobs without a message
                logger.warning(
                    "jobs are queued; publishing failed (they will be republished)",
                    extra={"job_ids": job_ids[:10], "jobs": len(job_ids), "error": str(error)},
                )


def _settle_each(batch: list[Member], refused: dict[int, TooMany]) -> None:
    for i, member in enumerate(batch):
        _settle([member], refused.get(i))


def _settle(batch: list[Member], error: BaseException | None) -> None:
    for _, _, done in batch:
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)


def _as_client_error(error: Exception) -> Exception:
    """A 422 where the database refused the job's own values (validation should have caught them);
    anything else stays the fault it is (a 5xx)."""
    if not isinstance(error, DataError | IntegrityError) and not isinstance(error.__cause__, UnicodeError):
        return error
    logger.warning("the database refused a job's data", extra={"error": _first_line(error)})
    message = f"the database cannot store this job's data: {escaped(_first_line(error))}"
    return Invalid(("body",), message, "unstorable_value")


def _first_line(error: BaseException) -> str:
    return next(iter(str(getattr(error, "orig", None) or error).splitlines()), type(error).__name__)
