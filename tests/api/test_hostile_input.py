"""Hostile input found by fuzzing a real deployment (issue 23): each is a clear 4xx, never a 500, and no
request fails another's. Against the real PostgreSQL and Redis."""

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from api.http.problems import Invalid
from api.jobs.submitter import Submitter
from core.models import Job
from core.settings import Settings
from tests.support.jobs_client import Database, queued_job

pytestmark = pytest.mark.fast

JSON = {"content-type": "application/json"}
SURROGATE = "\\ud800"  # as JSON escapes it: the parsed text holds a lone surrogate


def _settings(settings: Settings, **changes: Any) -> Settings:
    return Settings(**{**settings.model_dump(), "max_wait_seconds": 0.0, **changes})


@pytest.fixture
def client(service_settings: Settings) -> Iterator[TestClient]:
    app = create_app(_settings(service_settings))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _problems(response: Any) -> str:
    detail = response.json()["detail"]
    return detail if isinstance(detail, str) else " | ".join(f"{p['loc']}: {p['msg']}" for p in detail)


# --- lone surrogates ---


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ('{"prompt": "hi %s"}', "prompt"),
        ('{"messages": [{"role": "user", "content": "hi %s"}]}', "content"),
        ('{"prompt": "hi", "stop": ["%s"]}', "stop"),
        ('{"prompt": "hi", "metadata": {"k": "%s"}}', "metadata"),
        ('{"prompt": "hi", "metadata": {"k%s": "v"}}', "metadata"),
    ],
)
def test_a_lone_surrogate_in_a_job_is_a_422_naming_the_field(
    client: TestClient, body: str, where: str
) -> None:
    response = client.post("/v1/jobs", content=(body % SURROGATE).encode(), headers=JSON)

    assert response.status_code == 422, response.text
    assert "lone surrogate" in _problems(response) and where in _problems(response)
    response.content.decode("utf-8")  # the error itself is valid UTF-8


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi %s"}]}'),
        ("/v1/completions", '{"prompt": "hi %s"}'),
        ("/v1/completions", '{"prompt": "hi", "stop": "%s"}'),
    ],
)
def test_a_lone_surrogate_in_an_openai_request_is_a_400(client: TestClient, path: str, body: str) -> None:
    response = client.post(path, content=(body % SURROGATE).encode(), headers=JSON)

    assert response.status_code == 400, response.text
    assert "lone surrogate" in response.json()["error"]["message"]


# --- NUL in the URL and headers ---

NUL_URLS = [
    ("GET", "/v1/jobs/job_a%00b", "job_id"),
    ("GET", "/v1/jobs/job_a%00b/events", "job_id"),
    ("POST", "/v1/jobs/job_a%00b/cancel", "job_id"),
    ("GET", "/v1/jobs/job_a%00b/webhook-deliveries", "job_id"),
    ("GET", "/v1/jobs/job_a%00b/request", "job_id"),
    ("GET", "/v1/jobs?after=a%00", "after"),
    ("GET", "/v1/jobs?batch_id=a%00", "batch_id"),
    ("GET", "/v1/jobs?metadata.k=a%00", "metadata.k"),
    ("GET", "/v1/jobs?metadata.a%00=b", "metadata.a\\u0000"),  # escaped where echoed
    ("GET", "/v1/files/file_a%00", "file_id"),
    ("GET", "/v1/files/file_a%00/content", "file_id"),
    ("DELETE", "/v1/files/file_a%00", "file_id"),
    ("GET", "/v1/batches/batch_a%00", "batch_id"),
    ("POST", "/v1/batches/batch_a%00/cancel", "batch_id"),
    ("GET", "/v1/batches/batch_a%00/webhook-deliveries", "batch_id"),
    ("GET", "/v1/batches/batch_a%00/latency", "batch_id"),
    ("GET", "/v1/batches?after=a%00", "after"),
]


@pytest.mark.parametrize(("method", "url", "name"), NUL_URLS)
def test_nul_in_a_path_id_or_query_parameter_is_a_422_naming_it(
    client: TestClient, method: str, url: str, name: str
) -> None:
    response = client.request(method, url)

    assert response.status_code == 422, response.text
    problem = response.json()["detail"][0]
    assert problem["loc"][1] == name and "NUL" in problem["msg"]


def test_nul_in_an_idempotency_key_is_a_422(client: TestClient) -> None:
    response = client.post("/v1/jobs", json={"prompt": "hi"}, headers={"Idempotency-Key": "a\x00b"})

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]


# --- uploads and batches ---


def test_an_upload_file_name_the_table_cannot_keep_is_a_422(client: TestClient) -> None:
    response = client.post("/v1/files", files={"file": ("x" * 256, b"{}\n")}, data={"purpose": "batch"})

    assert response.status_code == 422, response.text
    assert "256 characters long" in response.json()["error"]["message"]
    ok = client.post("/v1/files", files={"file": ("x" * 255, b"{}\n")}, data={"purpose": "batch"})
    assert ok.status_code == 200 and ok.json()["filename"] == "x" * 255


def test_nul_in_a_batch_input_file_id_is_a_422(client: TestClient) -> None:
    body = {"input_file_id": "file_\x00", "endpoint": "/v1/completions", "completion_window": "24h"}

    response = client.post("/v1/batches", json=body)

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "input_file_id"]


def _line(custom_id: str = '"a"', body: str = '{"prompt": "hi"}') -> bytes:
    return (
        f'{{"custom_id": {custom_id}, "method": "POST", "url": "/v1/completions", "body": {body}}}'.encode()
    )


@pytest.mark.parametrize(
    ("line", "code", "message"),
    [
        (_line(body='{"prompt": "hi @"}'.replace("@", SURROGATE)), "invalid_json_line", "lone surrogate"),
        (_line(custom_id='"a@"'.replace("@", SURROGATE)), "invalid_json_line", "lone surrogate"),
        (
            _line(body='{"prompt": "hi", "metadata": {"k": "@"}}'.replace("@", SURROGATE)),
            "invalid_json_line",
            "surrogate",
        ),
        (_line(custom_id='"a\\u0000"'), "invalid_value", "NUL"),
        (_line(body='{"prompt": "hi", "a\\u0000": 1}'), "unknown_parameter", "unknown parameter"),
        (
            _line(body='{"prompt": "hi", "metadata": %s}' % ("[" * 5000 + "]" * 5000)),
            "invalid_json_line",
            "deep",
        ),
    ],
)
def test_a_hostile_batch_line_fails_the_batch_naming_the_line(
    client: TestClient, line: bytes, code: str, message: str
) -> None:
    content = _line(custom_id='"good"') + b"\n" + line + b"\n"
    file = client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}).json()
    body = {"input_file_id": file["id"], "endpoint": "/v1/completions", "completion_window": "24h"}

    response = client.post("/v1/batches", json=body)

    assert response.status_code == 200, response.text
    batch = response.json()
    assert batch["status"] == "failed"
    [error] = batch["errors"]["data"]
    assert (error["line"], error["code"]) == (2, code) and message in error["message"], error


# --- one bad job among many: group commit ---


def test_a_job_the_database_refuses_fails_alone_in_its_group_commit(
    service_settings: Settings, db: Database
) -> None:
    """Validation refuses what PostgreSQL refuses; should a job still slip through, only it fails."""
    app = create_app(service_settings)
    service = app.state.service
    submitter = Submitter(service.sessions, service.celery)
    model = service.settings.served_model_name
    bad = {"k": "\ud800"}
    jobs = [queued_job(model, f"job {i}", bad if i in (7, 30) else {"i": str(i)}) for i in range(40)]

    async def submit_all() -> list[BaseException | None]:
        return await asyncio.gather(*(submitter.submit(j) for j in jobs), return_exceptions=True)

    results = asyncio.run(submit_all())
    service.db_engine.dispose()

    failed = {i for i, result in enumerate(results) if result is not None}
    assert failed == {7, 30}, results
    assert all(isinstance(results[i], Invalid) for i in failed)
    assert "cannot store" in results[7].errors()[0]["msg"]  # type: ignore[union-attr]
    with db.sessions() as session:
        stored = set(session.scalars(select(Job.prompt)))
    assert stored == {f"job {i}" for i in range(40) if i not in failed}


# --- body size and prompt length ---


def test_a_body_over_the_limit_is_a_413_before_it_is_read_whole(service_settings: Settings) -> None:
    settings = _settings(service_settings, max_request_bytes=4096, max_upload_bytes=8192)
    with TestClient(create_app(settings)) as client:
        big = json.dumps({"prompt": "x" * 5000}).encode()
        declared = client.post("/v1/jobs", content=big, headers=JSON)
        chunked = client.post("/v1/jobs", content=iter([big[:3000], big[3000:]]), headers=JSON)
        upload = client.post("/v1/files", files={"file": ("a.jsonl", b"x" * 9000)}, data={"purpose": "batch"})
        small_upload = client.post(
            "/v1/files", files={"file": ("a.jsonl", b"{}\n" * 2000)}, data={"purpose": "batch"}
        )

    for response in (declared, chunked):
        assert response.status_code == 413, response.text
        assert "limit of 4096 bytes (PAGEDQ_MAX_REQUEST_BYTES)" in response.json()["detail"]
    assert upload.status_code == 413 and "PAGEDQ_MAX_UPLOAD_BYTES" in upload.json()["error"]["message"]
    assert small_upload.status_code == 200, small_upload.text  # uploads have their own, larger limit


def test_a_prompt_longer_than_any_context_could_hold_is_refused_before_tokenizing(client: TestClient) -> None:
    models = client.app.state.service.models
    encoder = models.encoder(models.default_chat)
    assert encoder.max_chars is not None and encoder.max_chars >= encoder.context_length
    encoder._lock.acquire()  # tokenizing would wait for this: the refusal must not need it
    try:
        response = client.post("/v1/jobs", json={"prompt": "x" * (encoder.max_chars + 1)})
    finally:
        encoder._lock.release()

    assert response.status_code == 422, response.text
    assert f"holds at most {encoder.max_chars} characters" in _problems(response)


class WatchedLock:
    """A lock that says when someone waits for it (a try that does not wait is no wait)."""

    def __init__(self) -> None:
        self.lock, self.wanted = threading.Lock(), threading.Event()

    def acquire(self, blocking: bool = True) -> bool:
        if blocking:
            self.wanted.set()
        return self.lock.acquire(blocking)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_the_event_loop_serves_other_requests_while_a_prompt_waits_for_the_tokenizer(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch check holds the tokenizer for a slice at a time: a job submitted meanwhile must wait in
    the tokenizer's thread, not on the event loop, where it would stall /healthz and everything else."""
    models = client.app.state.service.models
    encoder = models.encoder(models.default_chat)
    submitted: list[int] = []
    held = WatchedLock()
    monkeypatch.setattr(encoder, "_lock", held)
    held.lock.acquire()
    try:
        submitter = threading.Thread(
            target=lambda: submitted.append(client.post("/v1/jobs", json={"prompt": "hi"}).status_code)
        )
        submitter.start()
        assert held.wanted.wait(10), "the submission never reached the tokenizer"
        health: list[int] = []
        checker = threading.Thread(target=lambda: health.append(client.get("/healthz").status_code))
        checker.start()
        checker.join(5)
        answered_while_held = health == [200]
    finally:
        held.lock.release()
    submitter.join(10)
    checker.join(10)

    assert answered_while_held, "GET /healthz waited for the tokenizer"
    assert submitted == [202]
