"""``Prefer: wait=N``: hold a submission's answer until its job finishes or N seconds pass.

One poller serves every waiting request with one query per tick, so a thousand waiters cost one query
every ``interval``, not a thousand, and no thread is held while waiting.
"""

import asyncio
import logging
import re
from collections import Counter

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from core.models import Job
from core.states import TERMINAL

logger = logging.getLogger(__name__)

_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def wait_preference(prefer: str | None, max_wait: float) -> float | None:
    """The seconds to wait asked by a ``Prefer`` header, capped; None when it asks for none (RFC 7240)."""
    match = _WAIT.search(prefer or "")
    return min(float(match.group(1)), max_wait) if match else None


class JobWaiter:
    def __init__(self, sessions: sessionmaker[Session], interval: float = 0.025) -> None:
        self._sessions = sessions
        self._interval = interval
        self._finished: dict[str, asyncio.Event] = {}
        self._waiters: Counter[str] = Counter()
        self._poller: asyncio.Task[None] | None = None

    async def wait(self, job_id: str, timeout: float) -> bool:
        """True once the job is terminal, False when ``timeout`` seconds passed first."""
        event = self._finished.setdefault(job_id, asyncio.Event())
        self._waiters[job_id] += 1
        self._ensure_poller()
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters[job_id] -= 1
            if not self._waiters[job_id]:
                del self._waiters[job_id], self._finished[job_id]

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()

    def _ensure_poller(self) -> None:
        poller = self._poller
        if poller is None or poller.done() or poller.get_loop() is not asyncio.get_running_loop():
            self._poller = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while self._finished:
            await asyncio.sleep(self._interval)
            try:
                done = await run_in_threadpool(self._terminal, list(self._finished))
            except Exception as error:  # waiters time out on their own; keep serving the others
                logger.warning("polling waited-on jobs failed: %s", error)
                continue
            for job_id in done:
                if event := self._finished.get(job_id):
                    event.set()

    def _terminal(self, job_ids: list[str]) -> list[str]:
        with self._sessions() as session:
            query = select(Job.id).where(Job.id.in_(job_ids), Job.status.in_(TERMINAL))
            return list(session.scalars(query))
