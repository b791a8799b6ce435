"""The real service a service bench runs against: PostgreSQL and Redis, a migrated database, the API and
``pagedq worker`` processes, each started on demand and all stopped at the end.

The servers are the bench's own (``initdb``/``pg_ctl`` and ``redis-server`` on free ports, as the fault
tests use them), which it may stop and kill; or, with ``Shared``, a fresh database on the machine's
PostgreSQL and a flushed Redis database, where a bench measures what a deployment's servers do.
"""

import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from sqlalchemy import Select, func, select
from sqlalchemy.exc import OperationalError

from core.models import Job
from core.settings import Settings
from core.states import TERMINAL
from migrations import upgrade
from tests.support.jobs_client import Database, api_over_http, start_worker
from tests.support.private_postgres import PrivatePostgres, private_postgres
from tests.support.private_redis import PrivateRedis, private_redis
from tests.support.services import (
    POSTGRES_ADMIN_URL,
    Process,
    free_port,
    service_env,
    sqlalchemy_url,
    wait_for,
)

# The Redis database a bench on the machine's servers flushes and uses (the tests' is another).
BENCH_REDIS_URL = os.environ.get("PAGEDQ_BENCH_REDIS", "redis://127.0.0.1:6379/13")


@dataclass(frozen=True)
class Shared:
    """A database of this name on the machine's PostgreSQL (dropped and made again) and this Redis
    database (flushed)."""

    database: str
    redis_url: str


@dataclass
class Stack:
    settings: Settings
    db: Database
    work: Path  # the processes' logs, and the service's data_dir
    postgres: PrivatePostgres | None  # the bench's own servers, to stop or kill; None with Shared
    redis: PrivateRedis | None
    processes: list[Process] = field(default_factory=list)

    def worker(self, name: str = "worker", model: str | None = None, **fields: Any) -> Process:
        """A ``pagedq worker`` of the served ``model`` (default: the chat model), the stack's settings and
        ``fields`` (logging to ``<name>.log``), once it has registered."""
        settings = self.settings.model_copy(update=fields)
        process = start_worker(settings, self.db, self.work / f"{name}.log", timeout=600, model=model)
        self.processes.append(process)
        return process

    def api(self, admin_key: str | None = None) -> tuple[Process, str]:
        """``pagedq api`` as processes of their own (``api_workers`` of them), and its URL once it reaches
        the database and the broker (with no worker yet, ``/readyz`` is a 503 that says so). With auth on,
        ``/readyz`` takes ``admin_key``."""
        process = Process(["api"], service_env(self.settings), self.work / "api.log")
        self.processes.append(process)
        url = f"http://127.0.0.1:{self.settings.port}"
        wait_for(lambda: _reaches_servers(url, admin_key), 120, f"the API at {url}", interval=0.2)
        return process, url

    def api_in_process(self) -> AbstractContextManager[str]:
        """The API served by uvicorn in a thread of this process: its URL."""
        return api_over_http(self.settings)

    def ended(self, ids: list[str], interval: float = 0.5) -> list[Job]:
        """The jobs once every one has ended (asking again while the database is away). It polls a count,
        not the rows: a job row comes with its token times, and reading 32 jobs of 1,000 tokens twice a
        second took a third of a core from the worker it measures."""
        unended = select(func.count()).where(Job.id.in_(ids), Job.status.not_in(TERMINAL))
        wait_for(lambda: self._scalar(unended) == 0, 7200, f"{len(ids)} jobs to end", interval=interval)
        return self.db.jobs(ids)

    def completion_tokens(self, ids: list[str]) -> int | None:
        """The tokens flushed so far by the jobs ``ids`` (None while the database is away)."""
        return self._scalar(select(func.coalesce(func.sum(Job.completion_tokens), 0)).where(Job.id.in_(ids)))

    def _scalar(self, statement: Select[Any]) -> Any:
        try:
            with self.db.sessions() as session:
                return session.scalar(statement)
        except OperationalError:
            return None


def submit_jobs(url: str, prompts: list[str], max_tokens: int, submitters: int = 1) -> list[str]:
    """One job per prompt of ``max_tokens`` tokens each (greedy, ``ignore_eos``), from ``submitters``
    concurrent clients; their ids in the prompts' order."""
    body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(submitters) as pool:

        def submit(prompt: str) -> str:
            return client.post("/v1/jobs", json={"prompt": prompt, **body}).raise_for_status().json()["id"]

        return list(pool.map(submit, prompts))


@contextmanager
def service_stack(shared: Shared | None = None, keep: bool = False, **fields: Any) -> Iterator[Stack]:
    """A stack of ``Settings(**fields)`` on the bench's own servers, or on ``shared`` ones. ``keep``: the
    work folder (logs) stays for a look afterwards."""
    work = Path(tempfile.mkdtemp(prefix="pagedq-bench-"))
    if keep:
        print(f"logs in {work}")
    try:
        with ExitStack() as servers:
            postgres = redis_server = None
            if shared is None:
                if shutil.which("redis-server") is None:
                    raise SystemExit("redis-server is not on PATH")
                postgres = servers.enter_context(private_postgres())
                redis_server = servers.enter_context(private_redis(work))
                database_url, broker_url = postgres.create_migrated_database(), redis_server.url()
            else:
                database_url, broker_url = _fresh(shared), shared.redis_url
            settings = Settings(
                database_url=database_url,
                broker_url=broker_url,
                data_dir=work / "data",
                port=free_port(),
                **fields,
            )
            stack = Stack(settings, Database(settings), work, postgres, redis_server)
            try:
                yield stack
            finally:
                for process in reversed(stack.processes):  # the workers before the API
                    process.stop()
                stack.db.close()
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _fresh(shared: Shared) -> str:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{shared.database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{shared.database}"')
    url = sqlalchemy_url(shared.database)
    upgrade(Settings(database_url=url))
    redis.Redis.from_url(shared.redis_url).flushdb()
    return url


def _reaches_servers(url: str, admin_key: str | None) -> bool:
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        checks = httpx.get(url + "/readyz", headers=headers).json()["checks"]
    except (httpx.TransportError, ValueError, KeyError):
        return False
    return checks["database"] == checks["broker"] == "ok"
