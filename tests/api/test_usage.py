"""GET /v1/usage against the real PostgreSQL: rows per key, model and UTC day; a key sees only its own."""

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from api.app import create_app
from core.models import Job, utcnow
from core.settings import Settings
from tests.api.test_keys import (
    BODY,
    _own_queue_dropped,  # noqa: F401  (autouse: the queued jobs' messages go)
    bearer,
    key_id,
    make_key,
)
from tests.support.jobs_client import Database

DAY_ONE, DAY_TWO = datetime(2026, 11, 23, 23, 30, tzinfo=UTC), datetime(2026, 11, 24, 0, 30, tzinfo=UTC)


@pytest.fixture
def settings(service_settings: Settings) -> Settings:
    return Settings(**{**service_settings.model_dump(), "auth": "required"})


@pytest.fixture
def admin(db: Database) -> str:
    return make_key(db, "root", admin=True)


@pytest.fixture
def client(settings: Settings, admin: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def ended(db: Database, job_id: str, finished_at: datetime, engine_ms: float) -> None:
    """As a worker ends a job (the API only queues it here)."""
    values = {"status": "succeeded", "finished_at": finished_at, "completion_tokens": 4, "cached_tokens": 2}
    with db.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values, engine_ms=engine_ms))


def test_usage_is_per_key_model_and_day_and_a_key_sees_only_its_own(
    client: TestClient, db: Database, settings: Settings, admin: str
) -> None:
    alice, bob = make_key(db, "alice"), make_key(db, "bob")
    runs = [(alice, DAY_ONE, 10.0), (alice, DAY_ONE, 5.5), (alice, DAY_TWO, 1.0), (bob, DAY_TWO, 7.0)]
    for key, day, engine_ms in runs:
        job = client.post("/v1/jobs", json=BODY, headers=bearer(key)).json()
        ended(db, job["id"], day, engine_ms)
    client.post("/v1/jobs", json=BODY, headers=bearer(bob))  # still queued: not counted

    def rows(caller: str, **query: str) -> list[tuple[object, ...]]:
        response = client.get("/v1/usage", params=query, headers=bearer(caller))
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        return [(r["key_name"], r["day"], r["jobs"], r["completion_tokens"], r["engine_ms"]) for r in data]

    everyone = [
        ("alice", "2026-11-24", 1, 4, 1.0),
        ("bob", "2026-11-24", 1, 4, 7.0),
        ("alice", "2026-11-23", 2, 8, 15.5),
    ]
    assert rows(admin) == everyone
    assert rows(alice) == [everyone[0], everyone[2]]
    assert rows(bob) == [everyone[1]]
    assert rows(alice, key="bob") == [] == rows(bob, key=key_id(db, "alice"))  # narrows, never widens
    assert rows(admin, key="bob") == [everyone[1]]
    assert rows(admin, start="2026-11-24") == everyone[:2] and rows(admin, end="2026-11-23") == everyone[2:]
    assert rows(admin, model="no-such-model") == []
    [row] = client.get("/v1/usage", params={"key": "bob"}, headers=bearer(admin)).json()["data"]
    assert row["model"] == settings.served_model_name
    assert row["prompt_tokens"] > 0 and row["cached_tokens"] == 2
    assert client.get("/v1/usage").status_code == 401


def test_metrics_count_ended_jobs_tokens_and_engine_seconds_by_key_name(
    client: TestClient, db: Database, settings: Settings, admin: str
) -> None:
    alice = make_key(db, "alice")
    for engine_ms in (250.0, 500.0):
        job = client.post("/v1/jobs", json=BODY, headers=bearer(alice)).json()
        ended(db, job["id"], utcnow(), engine_ms)
    for _ in range(2):  # counted once, whichever scrape saw them first
        families = text_string_to_metric_families(client.get("/metrics", headers=bearer(admin)).text)
        samples = {
            (s.name, s.labels.get("key"), s.labels.get("kind")): s.value for f in families for s in f.samples
        }
        assert samples[("pagedq_engine_seconds_total", "alice", None)] == 0.75
        assert samples[("pagedq_tokens_total", "alice", "completion")] == 8
