"""A worker's heartbeat never waits behind job work: with every connection its claims may use stuck behind a
lock, it still beats on time, so no other worker takes its jobs; and every pool of the worker fits the
threads that use it (worker/connections.py)."""

import time

import psycopg
import pytest
from sqlalchemy import make_url, select

from core.models import Worker, utcnow
from core.settings import Settings
from tests.support.jobs_client import Database, api_client, start_worker, submit
from tests.support.services import POSTGRES_ADMIN_URL, wait_for
from tests.worker.test_worker import PROMPTS
from worker.connections import CLAIM_TURNS, HEARTBEAT_POOL_USERS, JOBS_POOL_USERS, WorkerConnections


def lock_waiters(admin: psycopg.Connection, database: str) -> int:
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
    return admin.execute(query, [database]).fetchone()[0]


def heartbeat_age(db: Database, pid: int) -> float:
    with db.sessions() as session:
        beat = session.scalar(select(Worker.heartbeat_at).where(Worker.id.endswith(f":{pid}")))
    return (utcnow() - beat).total_seconds()


def test_the_heartbeat_lands_on_time_while_claims_wait_on_a_locked_jobs_table(
    service_settings: Settings, db: Database, tmp_path
):
    settings = service_settings  # 32 Celery threads (max_num_seqs), a 3 s heartbeat timeout
    jobs = 40  # a message for every thread
    with api_client(settings) as client:
        ids = [submit(client, prompt=p, max_tokens=4) for p in PROMPTS[:jobs]]
    name = make_url(settings.database_url).database
    server = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    with (
        psycopg.connect(f"{server}/{name}") as locker,
        psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin,
    ):
        locker.execute(
            "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"
        )  # every claim waits, holding its connection
        worker = start_worker(settings, db, tmp_path / "worker.log")
        try:
            # A claim's pick waits on the lock, the other turns for their picks (one at a time), and so
            # does its reconciler once it judges.
            wait_for(lambda: lock_waiters(admin, name) >= 1, 60, "the claims to wait on the lock")
            watch_until = time.monotonic() + 2 * settings.heartbeat_timeout
            while time.monotonic() < watch_until:
                age = heartbeat_age(db, worker.popen.pid)
                assert age < settings.heartbeat_timeout, f"the heartbeat lapsed ({age:.1f} s old)"
                time.sleep(settings.heartbeat_period / 2)
            locker.rollback()
            finished = db.wait_until(ids, {"succeeded"}, timeout=120)
        finally:
            worker.stop()
    assert all(job.attempt == 1 for job in finished), "a live worker's job was run twice"
    assert "QueuePool limit" not in worker.log() and "requeued the job" not in worker.log()


@pytest.mark.fast
def test_every_pool_of_the_worker_fits_the_threads_that_use_it() -> None:
    settings = Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none", max_num_seqs=256)
    connections = WorkerConnections.connect(settings)  # no connection is made
    try:
        assert connections.jobs.pool.size() >= sum(JOBS_POOL_USERS.values())
        assert connections.heartbeat.pool.size() >= sum(HEARTBEAT_POOL_USERS.values())
        # The 256 Celery threads use the jobs pool only in their turns, of which it holds room for all.
        assert JOBS_POOL_USERS["claim turns"] == CLAIM_TURNS < settings.max_num_seqs  # the jobs held
        turns = [connections.turns.acquire(blocking=False) for _ in range(CLAIM_TURNS + 1)]
        assert turns == [True] * CLAIM_TURNS + [False]
    finally:
        connections.dispose()
