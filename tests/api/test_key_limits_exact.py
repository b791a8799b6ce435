"""A key's max_active_jobs holds exactly under any concurrency: submissions and batch creations released
at once, through two API services (as two API processes would be) on one database; and a retry with an
Idempotency-Key is looked up before any limit, free, returning the earlier job. Against the real
PostgreSQL and Redis."""

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core.models import Batch, Job
from core.settings import Settings
from tests.api.test_keys import BODY, bearer, count, key_id, make_key, upload
from tests.support.jobs_client import Database

pytestmark = pytest.mark.fast

LIMIT = 5


@pytest.fixture
def settings(service_settings: Settings) -> Settings:
    return Settings(**{**service_settings.model_dump(), "auth": "required"})


@pytest.fixture
def clients(settings: Settings, db: Database) -> Iterator[list[TestClient]]:
    """Two API services on one database: the limit cannot live in one process's memory."""
    make_key(db, "root", admin=True)
    with (
        TestClient(create_app(settings)) as one,
        TestClient(create_app(settings)) as two,
    ):
        yield [one, two]


def at_once(calls: list[Callable[[], httpx.Response]]) -> list[int]:
    """Every call released at the same instant from a thread of its own; their status codes."""
    start = threading.Barrier(len(calls))

    def released(call: Callable[[], httpx.Response]) -> int:
        start.wait()
        return call().status_code

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(released, calls))


def post(client: TestClient, path: str, body: dict[str, Any], key: str) -> Callable[[], httpx.Response]:
    return lambda: client.post(path, json=body, headers=bearer(key))


def test_fifty_submissions_at_once_through_two_apis_take_exactly_the_limit(
    clients: list[TestClient], db: Database
) -> None:
    key = make_key(db, "burst", max_active_jobs=LIMIT)
    calls = [post(clients[i % 2], "/v1/jobs", BODY, key) for i in range(50)]
    codes = at_once(calls)
    assert sorted(codes) == [202] * LIMIT + [429] * (50 - LIMIT)
    assert count(db, Job, key_id=key_id(db, "burst")) == LIMIT


def test_eight_batches_at_once_take_exactly_the_limit(clients: list[TestClient], db: Database) -> None:
    key = make_key(db, "batches", max_active_jobs=LIMIT)
    files = [upload(clients[0], key, 1) for _ in range(8)]
    batch = {"endpoint": "/v1/completions", "completion_window": "24h"}
    calls = [
        post(clients[i % 2], "/v1/batches", {**batch, "input_file_id": f}, key) for i, f in enumerate(files)
    ]
    codes = at_once(calls)
    assert sorted(codes) == [200] * LIMIT + [429] * (8 - LIMIT)
    assert count(db, Job, key_id=key_id(db, "batches")) == LIMIT
    assert count(db, Batch) == LIMIT


def test_a_retry_with_its_idempotency_key_is_free_and_returns_the_earlier_job(
    clients: list[TestClient], db: Database
) -> None:
    key = make_key(db, "retrying", max_active_jobs=1, requests_per_second=1, tokens_per_minute=50)
    client = clients[0]
    headers = {**bearer(key), "Idempotency-Key": "order-7"}
    body = {**BODY, "max_tokens": 30}  # its prompt and max_tokens take most of the key's tokens a minute
    first = client.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 202, first.text
    for _ in range(3):  # at max_active_jobs, past requests_per_second and tokens_per_minute: still free
        again = client.post("/v1/jobs", json=body, headers=headers)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
    other = client.post("/v1/jobs", json={**body, "max_tokens": 31}, headers=headers)
    assert other.status_code == 422 and "different request body" in other.text
    assert client.post("/v1/jobs", json=BODY, headers=bearer(key)).status_code == 429  # new work is limited
    assert count(db, Job, key_id=key_id(db, "retrying")) == 1
