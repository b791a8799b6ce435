"""The real services the job-service tests use: PostgreSQL, Redis, and Celery workers as subprocesses.

A service that cannot be reached fails the test under ``CI=true`` and skips it elsewhere.
Every test gets a database of its own (cloned from a migrated template) and queues named after its own
model directory, on Redis db ``TEST_REDIS_DB``, so concurrent runs do not disturb each other.
"""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import psycopg
import pytest
import redis

from core.settings import Settings

POSTGRES_ADMIN_URL = os.environ.get("PAGEDQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("PAGEDQ_TEST_REDIS", "redis://127.0.0.1:6379")
TEST_REDIS_DB = 13
REPO = Path(__file__).resolve().parents[2]


def unavailable(what: str, error: Exception) -> None:
    message = f"{what} is not reachable ({error}); the job-service tests need it"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


def postgres_admin() -> psycopg.Connection:
    try:
        return psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        unavailable("PostgreSQL at " + POSTGRES_ADMIN_URL, error)
        raise


def sqlalchemy_url(database: str) -> str:
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{database}"


def redis_url() -> str:
    url = f"{REDIS_URL}/{TEST_REDIS_DB}"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except redis.RedisError as error:
        unavailable("Redis at " + REDIS_URL, error)
    return url


@contextmanager
def migrated_template() -> Iterator[str]:
    """A migrated database that per-test databases are cloned from (cloning beats migrating each time)."""
    from migrations import upgrade

    name = f"pagedq_test_tmpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with postgres_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade(Settings(database_url=sqlalchemy_url(name)))
        yield name
    finally:
        with postgres_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database_from(template: str) -> Iterator[str]:
    name = f"pagedq_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with postgres_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield sqlalchemy_url(name)
    finally:
        with postgres_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def service_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a ``pagedq`` subprocess use ``settings``."""
    env = dict(os.environ)
    for name, value in settings.model_dump(exclude_unset=True).items():
        if value is not None:
            env[f"PAGEDQ_{name.upper()}"] = str(value)
    env.setdefault("PAGEDQ_LOG_LEVEL", "INFO")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def async_wait_for(
    condition: Callable[[], object], timeout: float, what: str, interval: float = 0.01
) -> object:
    """``wait_for`` inside a coroutine: the event loop runs on between the polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Process:
    """A ``pagedq`` subcommand running as its own process group, logging to a file. Each is kept in
    ``STARTED``: a failing test's report carries the end of the log of each one still running or started
    by that test (tests/conftest.py)."""

    STARTED: ClassVar[list["Process"]] = []

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.started_at = time.time()
        self.log_path = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "pagedq", *args],
            env=env,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        Process.STARTED.append(self)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 60.0) -> int:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(10)
        finally:
            self._log.close()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)
        self._log.close()
