"""Helpers for driving the job service in tests: submit through the API, wait on job rows, read workers."""

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from core.db import make_db_engine, make_sessionmaker
from core.models import Job, Worker, utcnow
from core.queue import RUN_JOB_TASK, queue_name
from core.settings import Settings
from core.states import JobStatus
from tests.support.services import Process, service_env, wait_for


@contextmanager
def api_over_http(settings: Settings) -> Iterator[str]:
    """The API served over real HTTP by uvicorn, in a thread of this process, on a free port."""
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, port=0, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, "the API to start")
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def api_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def queued_job(model: str, prompt: str, meta: dict[str, str] | None = None) -> Job:
    """A new queued one-token job of ``model``, unsaved: what the API's submitter writes."""
    now = utcnow()
    return Job(
        status=JobStatus.QUEUED,
        model=model,
        priority=0,
        prompt=prompt,
        prompt_token_ids=[1, 2],
        prompt_tokens=2,
        params={"max_tokens": 1},
        meta=meta or {},
        queued_at=now,
        published_at=now,
    )


def submit(client: TestClient, **body: Any) -> str:
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return response.json()["id"]


class Database:
    """Direct reads of the job tables, to check what the service committed."""

    def __init__(self, settings: Settings) -> None:
        self.engine = make_db_engine(settings)
        self.sessions = make_sessionmaker(self.engine)

    def jobs(self, ids: list[str]) -> list[Job]:
        with self.sessions() as session:
            rows = {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(ids)))}
        return [rows[i] for i in ids]

    def wait_until(self, ids: list[str], statuses: set[str], timeout: float) -> list[Job]:
        def reached() -> list[Job] | None:
            jobs = self.jobs(ids)
            return jobs if all(job.status in statuses for job in jobs) else None

        return wait_for(reached, timeout, f"{len(ids)} jobs to reach {statuses}", interval=0.1)

    def worker_stats(self, pid: int) -> dict[str, float] | None:
        with self.sessions() as session:
            worker = session.scalars(select(Worker).where(Worker.id.endswith(f":{pid}"))).one_or_none()
            return None if worker is None else worker.stats

    def close(self) -> None:
        self.engine.dispose()


def start_worker(
    settings: Settings, db: Database, log: Path, timeout: float = 120, model: str | None = None
) -> Process:
    """A real ``pagedq worker`` process (of the served ``model``: ``--model``); returns once it has
    registered itself."""
    worker = Process(["worker", *(["--model", model] if model else [])], service_env(settings), log)
    try:
        wait_for(lambda: db.worker_stats(worker.popen.pid) is not None, timeout, "the worker to register")
    except AssertionError:
        worker.kill()
        raise AssertionError("the worker did not start:\n" + worker.log()[-4000:]) from None
    return worker


def job_messages(settings: Settings) -> list[str]:
    """The job ids of the run-job messages waiting in the model's Redis queue, one per message (a
    reconciler's probe, which travels in the same queue, is not a job message)."""
    broker = redis.Redis.from_url(settings.resolved_broker_url)
    ids: list[str] = []
    for key in broker.scan_iter(queue_name(settings.served_model_name) + "*"):
        for raw in broker.lrange(key, 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] == RUN_JOB_TASK:
                args, _, _ = json.loads(base64.b64decode(message["body"]))
                ids.extend(args)
    return ids
