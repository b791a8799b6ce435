"""Requests that could never be served as asked are refused at submission with the field at fault, and no
job is made: numbers sent as strings or booleans, constraints that match no text, stop strings with a
constraint, and a beam search wider than a step. Against the real PostgreSQL and Redis."""

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from core.models import Job
from core.settings import Settings
from tests.support.jobs_client import Database

pytestmark = pytest.mark.fast

PROMPT = {"prompt": "The quick brown fox"}


@pytest.fixture
def client(service_settings: Settings) -> Iterator[TestClient]:
    narrow = {"max_num_batched_tokens": 4, "max_num_seqs": 8, "max_wait_seconds": 0.0}
    settings = Settings(**{**service_settings.model_dump(), **narrow})
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def jobs(db: Database) -> int:
    with db.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


@pytest.mark.parametrize(
    ("body", "loc", "says"),
    [
        ({"max_tokens": "4"}, ["body", "max_tokens"], "valid integer"),
        ({"max_tokens": True}, ["body", "max_tokens"], "valid integer"),
        ({"temperature": "0.5"}, ["body", "temperature"], "valid number"),
        ({"priority": True}, ["body", "priority"], "valid integer"),
        ({"structured": {"regex": r"[^\s\S]"}}, ["body", "structured"], "matches no text"),
        ({"structured": {"grammar": "start: start"}}, ["body", "structured"], "matches no text"),
        ({"structured": {"json": {"$ref": "#"}}}, ["body", "structured"], "matches no text"),
        ({"structured": {"json_object": True}, "stop": ["}"]}, ["body", "stop"], "structured output"),
        ({"use_beam_search": True, "n": 6, "temperature": 0}, ["body", "n"], "max_num_batched_tokens"),
        ({"use_beam_search": True, "n": 2, "best_of": 5, "temperature": 0}, ["body", "best_of"], "at most 4"),
        ({"n": 9}, ["body", "n"], "max_num_seqs"),
        ({"completion_window": "0h"}, ["body", "completion_window"], "'<N>h' with 1 <= N <= 168"),
        ({"completion_window": "24 hours"}, ["body", "completion_window"], "'<N>h' with 1 <= N <= 168"),
    ],
)
def test_a_request_that_cannot_be_served_as_asked_is_a_422_naming_its_field(
    client: TestClient, db: Database, body: dict[str, Any], loc: list[str], says: str
) -> None:
    response = client.post("/v1/jobs", json={**PROMPT, **body})
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == loc and says in problem["msg"], problem
    assert jobs(db) == 0


def test_a_beam_search_as_wide_as_a_step_is_taken(client: TestClient, db: Database) -> None:
    body = {**PROMPT, "use_beam_search": True, "n": 4, "temperature": 0, "max_tokens": 2}
    assert client.post("/v1/jobs", json=body).status_code == 202
    assert jobs(db) == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": "4"}, "max_tokens"),
        ({"n": True}, "n"),
        ({"response_format": {"type": "json_object"}, "stop": "}"}, "stop"),
        ({"structured_outputs": {"regex": r"[^\s\S]"}}, "structured"),
    ],
)
def test_openai_routes_refuse_them_with_a_400(client: TestClient, body: dict[str, Any], param: str) -> None:
    response = client.post("/v1/completions", json={**PROMPT, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_a_jobs_completion_window_is_its_deadline(client: TestClient) -> None:
    job = client.post("/v1/jobs", json={**PROMPT, "completion_window": "2h"}).json()
    due = datetime.fromisoformat(job["deadline_at"]) - datetime.fromisoformat(job["timings"]["queued_at"])
    assert due == timedelta(hours=2)
    assert client.post("/v1/jobs", json=PROMPT).json()["deadline_at"] is None
