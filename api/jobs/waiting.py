"""``Prefer: wait=N``: hold a submission's answer until its job finishes or N seconds pass.

With Redis, workers (and the API, for a queued job it cancels) announce the jobs whose end they
committed (``core/streams.ENDED_CHANNEL``) and one listener per API process wakes their waiters. One
poller also serves every waiting request, with one query per tick: a waiter's first tick finds a job
that ended before the listener could hear of it, and every waiter is asked for each ``relaxed`` seconds
(an end nobody announced: the reconciler's, a message lost while Redis restarted). Without Redis, every
tick asks for every waiter. Asking the database every 25 ms for a job's end took its CPU from the
engine's step while the job ran: on two cores at batch 1 the job ran at +2.9 ms a token over the
engine alone, +0.7 since (bench/RESULTS.md, 2026-11-27). No thread is held while waiting."""

import asyncio
import logging
import re
import time
from collections import Counter

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from core.models import Job
from core.states import TERMINAL
from core.streams import ENDED_CHANNEL, ended_ids

logger = logging.getLogger(__name__)

LISTEN_RETRY_S = 5.0
_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def wait_preference(prefer: str | None, max_wait: float) -> float | None:
    """The seconds to wait asked by a ``Prefer`` header, capped; None when it asks for none (RFC 7240)."""
    match = _WAIT.search(prefer or "")
    return min(float(match.group(1)), max_wait) if match else None


class JobWaiter:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        announcements: str | None = None,
        interval: float = 0.025,
        relaxed: float = 0.5,
    ) -> None:
        """``announcements``: the Redis URL workers announce ended jobs on; None: poll alone."""
        self._sessions, self._url = sessions, announcements
        self._interval, self._relaxed = interval, relaxed
        self._finished: dict[str, asyncio.Event] = {}
        self._waiters: Counter[str] = Counter()
        self._fresh: set[str] = set()  # waited on since the last poll
        self._poller: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._listening = False  # subscribed: announced ends wake their waiters
        self._listen_again_at = 0.0  # after a listener failed (monotonic): not before

    async def wait(self, job_id: str, timeout: float) -> bool:
        """True once the job is terminal, False when ``timeout`` seconds passed first."""
        event = self._finished.setdefault(job_id, asyncio.Event())
        self._waiters[job_id] += 1
        self._fresh.add(job_id)
        self._ensure_tasks()
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
                self._fresh.discard(job_id)

    @property
    def listening(self) -> bool:
        """Subscribed to the workers' announcements: a waiter's job is asked for on its first tick only."""
        return self._listening

    async def close(self) -> None:
        for task in (self._poller, self._listener):
            if task is not None:
                task.cancel()

    def _ensure_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        poller = self._poller
        if poller is None or poller.done() or poller.get_loop() is not loop:
            self._poller = asyncio.create_task(self._poll())
        listener = self._listener
        gone = listener is None or listener.done() or listener.get_loop() is not loop
        if self._url is not None and gone and time.monotonic() >= self._listen_again_at:
            self._listening = False
            self._listener = asyncio.create_task(self._listen(self._url))

    async def _poll(self) -> None:
        asked_all_at = time.monotonic()
        while self._finished:
            await asyncio.sleep(self._interval)
            if not self._listening or time.monotonic() - asked_all_at >= self._relaxed:
                asking, asked_all_at = list(self._finished), time.monotonic()
            else:
                asking = list(self._fresh)
            self._fresh.clear()
            if not asking:
                continue
            try:
                done = await run_in_threadpool(self._terminal, asking)
            except Exception as error:  # waiters time out on their own; keep serving the others
                logger.warning("polling waited-on jobs failed: %s", error)
                continue
            self._wake(done)

    async def _listen(self, url: str) -> None:
        """Wakes the waiters of announced jobs, for as long as this loop runs; gone (Redis away), every
        tick asks the database again, and the next waiter starts a new listener."""
        client = Redis.from_url(url)
        try:
            async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(ENDED_CHANNEL)
                self._listening = True
                async for message in pubsub.listen():
                    self._wake(ended_ids(message["data"]))
        except RedisError as error:  # a new listener comes with a waiter after LISTEN_RETRY_S
            level = logging.WARNING if self._listening else logging.DEBUG
            logger.log(level, "not hearing of ended jobs; polling for them", extra={"error": str(error)})
            self._listen_again_at = time.monotonic() + LISTEN_RETRY_S
        finally:
            self._listening = False
            await client.aclose()

    def _wake(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            if event := self._finished.get(job_id):
                event.set()

    def _terminal(self, job_ids: list[str]) -> list[str]:
        with self._sessions() as session:
            query = select(Job.id).where(Job.id.in_(job_ids), Job.status.in_(TERMINAL))
            return list(session.scalars(query))
