"""What the tests of the worker's roles (claimer, flusher, host) share: job rows on the test's own
PostgreSQL database, and an outage of that database."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import make_url

from core.models import Job, utcnow
from tests.support.services import postgres_admin
from worker.store import JobStore

MODEL = "tiny"


def add_job(store: JobStore, **values: Any) -> str:
    with store.sessions.begin() as session:
        job = Job(model=MODEL, prompt_token_ids=[1, 2, 3], params={"max_tokens": 4}, published_at=utcnow())
        for name, value in values.items():
            setattr(job, name, value)
        session.add(job)
        session.flush()
        return job.id


def row(store: JobStore, job_id: str) -> Job:
    with store.sessions() as session:
        return session.get_one(Job, job_id)


@contextmanager
def database_away(database_url: str) -> Iterator[None]:
    """The database refuses connections and its open ones are cut, as when its server restarts; it is
    back when the block ends."""
    name = make_url(database_url).database
    with postgres_admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
    try:
        yield
    finally:
        with postgres_admin() as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
