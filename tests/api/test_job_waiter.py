"""Waiting for a job's end (``api/jobs/waiting.py``), on the real PostgreSQL and Redis: an end a worker
announces wakes its waiters without the database being asked again; an end nobody announced is still
found, on the waiter's first tick (it ended before the waiter came) or on a later full poll; without
Redis, or with Redis gone (a server of the test's own, killed), every tick asks."""

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import update

from api.jobs.waiting import JobWaiter
from core.models import Job
from core.settings import Settings
from core.states import JobStatus
from core.streams import ENDED_CHANNEL, end_announcer
from tests.support.jobs_client import Database
from tests.support.private_redis import private_redis
from tests.support.services import async_wait_for, redis_url

pytestmark = pytest.mark.fast
RELAXED = 60.0  # no full poll within a test: what wakes a waiter is the announcement or its first tick


def queued(db: Database) -> str:
    with db.sessions.begin() as session:
        job = Job(model="m", prompt_token_ids=[1], params={"max_tokens": 1})
        session.add(job)
        session.flush()
        return job.id


def end(db: Database, job_id: str) -> None:
    with db.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.SUCCEEDED))


class Counting(JobWaiter):
    """Records what the poller asks the database for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[list[str]] = []

    def _terminal(self, job_ids: list[str]) -> list[str]:
        self.asked.append(job_ids)
        return super()._terminal(job_ids)


def subscribers() -> int:
    return dict(redis.Redis.from_url(redis_url()).pubsub_numsub(ENDED_CHANNEL))[ENDED_CHANNEL.encode()]


def test_an_announced_end_wakes_its_waiter_and_an_unannounced_one_waits_for_a_poll(
    db: Database, service_settings: Settings
) -> None:
    announce = end_announcer(service_settings)
    assert announce is not None
    warm, first, second = queued(db), queued(db), queued(db)
    end(db, warm)

    async def scenario() -> tuple[bool, bool, list[list[str]]]:
        waiter = Counting(db.sessions, redis_url(), relaxed=RELAXED)
        try:
            assert await waiter.wait(warm, timeout=5)  # found by its first tick; the listener started
            await async_wait_for(lambda: waiter.listening and subscribers() >= 1, 5, "the listener")
            waiter.asked.clear()
            waiting = asyncio.create_task(waiter.wait(first, timeout=10))
            await async_wait_for(lambda: waiter.asked, 5, "the waiter's first tick")
            end(db, first)
            end(db, second)
            announce([first])
            woken = await waiting
            unannounced = await waiter.wait(second, timeout=0.5)  # found by its first tick alone
            return woken, unannounced, waiter.asked
        finally:
            await waiter.close()

    woken, unannounced, asked = asyncio.run(scenario())
    assert woken
    assert unannounced  # it had ended before its waiter came
    assert asked == [[first], [second]]  # each job asked for once: its first tick; no poll every tick


def test_an_end_nobody_announces_is_found_by_the_full_poll(db: Database) -> None:
    job = queued(db)

    async def scenario() -> bool:
        waiter = JobWaiter(db.sessions, redis_url(), relaxed=0.2)
        try:
            waiting = asyncio.create_task(waiter.wait(job, timeout=10))
            await async_wait_for(lambda: waiter.listening, 5, "the listener")
            end(db, job)  # a reconciler's failing it, say: nobody announces it
            return await waiting
        finally:
            await waiter.close()

    assert asyncio.run(scenario())


def test_without_redis_every_tick_asks_the_database(db: Database) -> None:
    job = queued(db)

    async def scenario() -> tuple[bool, int]:
        waiter = Counting(db.sessions, None, relaxed=RELAXED)
        try:
            waiting = asyncio.create_task(waiter.wait(job, timeout=10))
            await async_wait_for(lambda: len(waiter.asked) >= 3, 5, "three ticks")
            end(db, job)
            return await waiting, len(waiter.asked)
        finally:
            await waiter.close()

    woken, asked = asyncio.run(scenario())
    assert woken and asked >= 4


def test_with_redis_gone_every_tick_asks_again(db: Database, tmp_path: Path) -> None:
    job = queued(db)
    with private_redis(tmp_path) as server:

        async def scenario() -> bool:
            waiter = JobWaiter(db.sessions, server.url(), relaxed=RELAXED)
            try:
                waiting = asyncio.create_task(waiter.wait(job, timeout=60))
                await async_wait_for(lambda: waiter.listening, 5, "the listener")
                server.stop()
                await async_wait_for(lambda: not waiter.listening, 30, "the listener to notice")
                end(db, job)
                return await waiting
            finally:
                await waiter.close()

        assert asyncio.run(scenario())
