"""How the API writes submitted jobs (``api/jobs/submitter.py``), against the real PostgreSQL and Redis."""

import asyncio

import pytest
from sqlalchemy import event

from api.app import create_app
from api.jobs.submitter import Submitter
from core.queue import queue_depth, queue_name
from core.settings import Settings
from core.states import JobStatus
from tests.support.jobs_client import Database, queued_job

pytestmark = pytest.mark.fast


def test_a_lone_job_is_one_insert_without_a_transaction_and_a_group_shares_one(
    service_settings: Settings, db: Database
) -> None:
    """A lone job (no key limit to count) is written by one INSERT in autocommit: no BEGIN and COMMIT
    round trips before its message goes out. Jobs that arrive together still share one transaction."""
    service = create_app(service_settings).state.service
    submitter = Submitter(service.sessions, service.celery)
    model = service.settings.served_model_name
    statements: list[str] = []
    commits: list[object] = []
    event.listen(service.db_engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    event.listen(service.db_engine, "commit", commits.append)

    lone = queued_job(model, "alone", {"source": "lone"})
    asyncio.run(submitter.submit(lone))
    assert commits == [] and [s.split()[0] for s in statements] == ["INSERT"]
    [stored] = db.jobs([lone.id])  # committed: another connection reads it, each value as written
    assert (stored.status, stored.prompt, stored.meta) == (JobStatus.QUEUED, "alone", {"source": "lone"})

    statements.clear()
    group = [queued_job(model, f"together {i}") for i in range(3)]

    async def submit_together() -> None:
        await asyncio.gather(*(submitter.submit(job) for job in group))

    asyncio.run(submit_together())
    service.db_engine.dispose()
    assert len(commits) == 1 and [s.split()[0] for s in statements] == ["INSERT"]
    assert len(db.jobs([job.id for job in group])) == 3
    assert queue_depth(service.celery, queue_name(model)) == 4  # each job's message is published
