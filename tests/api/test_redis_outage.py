"""Redis away answers like the database away: a submission that needs Redis (its key's rate counters)
is a 503 with Retry-After, never a 500; reads that need only the database are served; and once Redis is
back, submissions are taken again. Against a private redis-server that the test kills and restarts, and
the real PostgreSQL."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from core import keys
from core.settings import Settings
from tests.support.jobs_client import Database
from tests.support.private_redis import PrivateRedis, private_redis

pytestmark = pytest.mark.fast

BODY = {"prompt": "The quick brown fox", "max_tokens": 2}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[PrivateRedis]:
    with private_redis(tmp_path) as server:
        yield server


@pytest.fixture
def client(service_settings: Settings, broker: PrivateRedis, db: Database) -> Iterator[TestClient]:
    settings = service_settings.model_copy(update={"broker_url": broker.url(13), "auth": "required"})
    with db.sessions.begin() as session:
        keys.create(session, "root", True)
        user = keys.create(session, "user", False)[1]
    app = create_app(settings)
    with TestClient(
        app, raise_server_exceptions=False, headers={"Authorization": f"Bearer {user}"}
    ) as client:
        yield client
        if broker.process is None or broker.process.poll() is not None:
            broker.start()  # the API's shutdown closes its Redis connections


def test_a_submission_while_redis_is_down_is_a_503_and_reads_are_served(
    client: TestClient, broker: PrivateRedis
) -> None:
    accepted = client.post("/v1/jobs", json=BODY)
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]

    broker.stop()
    for path, body in (("/v1/jobs", BODY), ("/v1/chat/completions", CHAT)):
        refused = client.post(path, json=body)
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert "Redis" in refused.json()["detail"]
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"
    assert [job["id"] for job in client.get("/v1/jobs").json()["data"]] == [job_id]

    broker.start()  # the same port: the limiter's connections come back by themselves
    assert client.post("/v1/jobs", json=BODY).status_code == 202
