"""The REST API against real PostgreSQL and Redis (no worker: tests write job rows as a worker would)."""

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, select, update
from sqlalchemy.orm import Session, sessionmaker
from transformers import AutoTokenizer

from api.app import create_app
from core.db import make_db_engine, make_sessionmaker
from core.models import Job, TokenTimes, Worker, time_ordered_id, utcnow
from core.queue import make_celery, queue_depth, queue_name
from core.settings import Settings
from core.streams import ENDED_CHANNEL, ended_ids
from tests.support.services import wait_for

PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture
def db(service_settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_db_engine(service_settings)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(autouse=True)
def _own_queue_dropped(service_settings: Settings) -> Iterator[None]:
    """Redis db 13 outlives the test: remove this test's queue (and its priority sub-queues)."""
    yield
    queue = queue_name(service_settings.served_model_name)
    broker = redis.Redis.from_url(service_settings.broker_url)
    keys = [*broker.scan_iter(f"{queue}*"), *broker.scan_iter(f"_kombu.binding*.{queue}")]
    if keys:
        broker.delete(*keys)


@pytest.fixture
def client(service_settings: Settings) -> Iterator[TestClient]:
    with _client(service_settings) as client:
        yield client


def _client(settings: Settings) -> TestClient:
    return TestClient(create_app(settings))


def _changed(settings: Settings, changes: dict[str, Any]) -> Settings:
    """A new Settings (``model_copy`` would keep the cached resolved URLs of the old one)."""
    return Settings(**{**settings.model_dump(), **changes})


def _depth(settings: Settings) -> int:
    return queue_depth(make_celery(settings), queue_name(settings.served_model_name))


def _submit(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json={"prompt": PROMPT, **body})
    assert response.status_code == 202, response.text
    return response.json()


def _row(db: sessionmaker[Session], job_id: str) -> Job:
    with db() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def _set(
    db: sessionmaker[Session], job_id: str, token_times_ms: list[float] | None = None, **values: Any
) -> None:
    with db() as session:
        session.execute(update(Job).where(Job.id == job_id).values(**values))
        if token_times_ms is not None:  # as a worker's run appends them: a chunk per flush
            attempt = session.get_one(Job, job_id).attempt
            half = len(token_times_ms) // 2
            for first, chunk in ((0, token_times_ms[:half]), (half, token_times_ms[half:])):
                session.add(TokenTimes(job_id=job_id, attempt=attempt, first=first, times_ms=chunk))
        session.commit()


def _job_ids(db: sessionmaker[Session]) -> list[str]:
    with db() as session:
        return list(session.scalars(select(Job.id)))


def _messages(response: Any) -> str:
    return " | ".join(item["msg"] for item in response.json()["detail"])


# --- submitting ---


def test_submit_persists_the_tokenized_job_then_publishes_its_id(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    response = client.post(
        "/v1/jobs",
        json={
            "prompt": PROMPT,
            "max_tokens": 7,
            "temperature": 0,
            "priority": -5,
            "metadata": {"user": "ann"},
        },
    )

    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued"
    assert job["model"] == service_settings.served_model_name
    row = _row(db, job["id"])
    expected_ids = AutoTokenizer.from_pretrained(service_settings.model).encode(PROMPT)
    assert row.prompt_token_ids == expected_ids
    assert row.prompt_tokens == job["usage"]["prompt_tokens"] == len(expected_ids)
    assert row.params["max_tokens"] == 7 and row.params["temperature"] == 0
    assert "prompt" not in row.params and "metadata" not in row.params
    assert (row.meta, row.priority, row.prompt, row.messages) == ({"user": "ann"}, -5, PROMPT, None)
    assert row.published_at == row.queued_at
    assert _depth(service_settings) == 1


def test_chat_messages_are_tokenized_through_the_chat_template(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo wörld"}]

    job = _submit(client, prompt=None, messages=messages)

    tokenizer = AutoTokenizer.from_pretrained(service_settings.model)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    expected = tokenizer.encode(text, add_special_tokens=False)
    row = _row(db, job["id"])
    assert row.prompt_token_ids == expected
    assert job["usage"]["prompt_tokens"] == len(expected)
    assert row.messages == messages and row.prompt is None


def test_submit_still_accepts_the_job_when_the_broker_is_down(
    service_settings: Settings, db: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    down = _changed(service_settings, {"broker_url": "redis://127.0.0.1:1/0"})
    with _client(down) as client:
        job = _submit(client)

    assert _row(db, job["id"]).status == "queued"
    assert any(
        job["id"] in getattr(record, "job_ids", ()) and record.levelname == "WARNING"
        for record in caplog.records
    )


# --- idempotency ---


def test_same_idempotency_key_and_body_returns_the_first_job(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    key = {"Idempotency-Key": "order-17"}
    first = client.post("/v1/jobs", json={"prompt": PROMPT, "max_tokens": 16}, headers=key)
    # The same request, spelled differently: defaults left out, keys in another order.
    again = client.post("/v1/jobs", json={"prompt": PROMPT}, headers=key)

    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    with db() as session:
        assert len(session.scalars(select(Job.id)).all()) == 1
    assert _depth(service_settings) == 1


def test_same_idempotency_key_with_another_body_is_rejected(client: TestClient) -> None:
    key = {"Idempotency-Key": "order-18"}
    first = client.post("/v1/jobs", json={"prompt": PROMPT}, headers=key)

    other = client.post("/v1/jobs", json={"prompt": PROMPT, "max_tokens": 3}, headers=key)

    assert other.status_code == 422
    assert "already used" in _messages(other) and first.json()["id"] in _messages(other)
    assert other.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]


def test_concurrent_submissions_with_one_key_create_one_job(
    client: TestClient, db: sessionmaker[Session]
) -> None:
    def submit(_: int) -> Any:
        return client.post("/v1/jobs", json={"prompt": PROMPT}, headers={"Idempotency-Key": "race"})

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(submit, range(8)))

    assert sorted(r.status_code for r in responses) == [200] * 7 + [202]
    assert len({r.json()["id"] for r in responses}) == 1
    with db() as session:
        assert len(session.scalars(select(Job.id)).all()) == 1


def test_concurrent_submissions_share_commits_and_each_is_published(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    commits = []
    engine = client.app.state.service.db_engine
    event.listen(engine, "commit", lambda conn: commits.append(1))
    with ThreadPoolExecutor(16) as pool:
        responses = list(
            pool.map(lambda i: client.post("/v1/jobs", json={"prompt": f"{PROMPT} {i}"}), range(64))
        )

    assert [r.status_code for r in responses] == [202] * 64
    with db() as session:
        stored = {job.id: job.prompt for job in session.scalars(select(Job))}
    assert stored == {r.json()["id"]: f"{PROMPT} {i}" for i, r in enumerate(responses)}
    assert _depth(service_settings) == 64
    assert len(commits) < 64  # group commit: concurrent jobs shared transactions


# --- bad input ---


@pytest.mark.fast
@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": PROMPT, "temprature": 0.5}, 422, "Extra inputs are not permitted"),
        ({"prompt": PROMPT, "messages": [{"role": "user", "content": "hi"}]}, 422, "exactly one of"),
        ({"max_tokens": 4}, 422, "exactly one of"),
        ({"prompt": PROMPT, "max_tokens": 0}, 422, "greater than or equal to 1"),
        ({"prompt": PROMPT, "max_tokens": 2000}, 422, "exceeds the model's context of 1024 tokens"),
        ({"prompt": PROMPT, "min_tokens": 9, "max_tokens": 4}, 422, "must not exceed max_tokens"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 422, "'system', 'user', 'assistant'"),
        ({"prompt": PROMPT, "priority": 101}, 422, "less than or equal to 100"),
        ([PROMPT], 422, "must be a JSON object"),
    ],
)
def test_bad_input_is_a_4xx_that_says_what_is_wrong(
    client: TestClient, body: Any, status: int, message: str
) -> None:
    response = client.post("/v1/jobs", json=body)

    assert response.status_code == status
    assert message in _messages(response)
    assert all(set(item) == {"type", "loc", "msg"} for item in response.json()["detail"])


@pytest.mark.fast
def test_what_the_engine_would_refuse_is_a_422_at_submission_not_a_failed_job(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    body = {"prompt": "Hello", "use_beam_search": True, "n": 2, "temperature": 0, "top_k": 5, "max_tokens": 8}

    response = client.post("/v1/jobs", json=body)

    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "top_k"] and "beam search does not support top_k" in problem["msg"]
    with db() as session:
        assert session.scalars(select(Job)).all() == []
    assert _depth(service_settings) == 0


@pytest.mark.fast
def test_left_out_sampling_parameters_take_the_models_generation_config(
    service_settings: Settings, db: sessionmaker[Session], tmp_path: Path
) -> None:
    model = tmp_path / "with-sampling-defaults"
    model.mkdir()
    for part in Path(service_settings.model).iterdir():
        if part.name != "generation_config.json":
            (model / part.name).symlink_to(part)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "top_p": 0.9}))
    settings = _changed(service_settings, {"model": str(model)})

    with _client(settings) as client:
        left_out = _submit(client)
        some_given = _submit(client, temperature=0.7)
        beams = _submit(client, use_beam_search=True, n=2, temperature=0)

    def params(job: dict[str, Any]) -> tuple[float, float]:
        stored = _row(db, job["id"]).params
        return stored["temperature"], stored["top_p"]

    assert params(left_out) == (0.2, 0.9)
    assert params(some_given) == (0.7, 0.9)
    assert params(beams) == (0.0, 1.0)  # beam search is deterministic: it takes no sampling defaults


@pytest.mark.fast
def test_too_long_prompt_names_the_numbers(client: TestClient) -> None:
    prompt_tokens = _submit(client)["usage"]["prompt_tokens"]

    response = client.post("/v1/jobs", json={"prompt": PROMPT, "max_tokens": 1024})

    assert response.status_code == 422
    total = prompt_tokens + 1024
    assert f"prompt ({prompt_tokens} tokens) + max_tokens (1024) = {total} tokens" in _messages(response)
    assert response.json()["detail"][0]["loc"] == ["body", "prompt"]


@pytest.mark.fast
def test_malformed_json_says_where(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs", content=b'{"prompt": "a",', headers={"content-type": "application/json"}
    )

    assert response.status_code == 422
    assert "not valid JSON" in _messages(response) and "at character 15" in _messages(response)


def test_unknown_job_is_404_with_its_id(client: TestClient) -> None:
    for response in (client.get("/v1/jobs/job_nope"), client.post("/v1/jobs/job_nope/cancel")):
        assert response.status_code == 404
        assert response.json() == {"detail": "job 'job_nope' not found"}


# --- reading ---


def test_job_reports_output_usage_and_timings(client: TestClient, db: sessionmaker[Session]) -> None:
    job = _submit(client)
    queued_at = _row(db, job["id"]).queued_at
    _set(
        db,
        job["id"],
        status="succeeded",
        output_text="four tokens here",
        finish_reason="length",
        completion_tokens=4,
        cached_tokens=3,
        engine_ms=12.5,
        started_at=queued_at + timedelta(milliseconds=100),
        first_token_at=queued_at + timedelta(milliseconds=150),
        finished_at=queued_at + timedelta(milliseconds=400),
        token_times_ms=[50.0, 80.0, 120.0, 140.0],
    )

    body = client.get(f"/v1/jobs/{job['id']}").json()

    assert (body["status"], body["output"], body["finish_reason"]) == (
        "succeeded",
        "four tokens here",
        "length",
    )
    prompt_tokens = job["usage"]["prompt_tokens"]
    assert body["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 4,
        "cached_tokens": 3,
        "total_tokens": prompt_tokens + 4,
        "engine_ms": 12.5,
    }
    timings = body["timings"]
    assert timings["queue_time_ms"] == pytest.approx(100)
    assert timings["time_to_first_token_ms"] == pytest.approx(50)
    assert timings["e2e_latency_ms"] == pytest.approx(400)
    assert timings["mean_time_per_output_token_ms"] == pytest.approx(30)
    assert timings["token_times_ms"] == [50.0, 80.0, 120.0, 140.0]


def test_list_walks_pages_newest_first_without_duplicates(client: TestClient) -> None:
    created = []
    for _ in range(5):
        created.append(_submit(client)["id"])
        millisecond = created[-1].removeprefix("job_")[:12]  # ids order by it: the next is a later one
        wait_for(lambda last=millisecond: time_ordered_id("")[:12] > last, 1, "the next millisecond", 0.001)

    pages, after = [], None
    while True:
        page = client.get("/v1/jobs", params={"limit": 2, **({"after": after} if after else {})}).json()
        pages.append([job["id"] for job in page["data"]])
        after = page["next_cursor"]
        assert page["has_more"] == (after is not None)
        if not page["has_more"]:
            break

    assert [len(page) for page in pages] == [2, 2, 1]
    assert [job_id for page in pages for job_id in page] == created[::-1]


def test_list_filters_by_status_and_metadata(client: TestClient, db: sessionmaker[Session]) -> None:
    ann = _submit(client, metadata={"user": "ann", "batch": "1"})["id"]
    bob = _submit(client, metadata={"user": "bob", "batch": "1"})["id"]
    ann_done = _submit(client, metadata={"user": "ann", "batch": "2"})["id"]
    _set(db, ann_done, status="succeeded")

    def ids(**params: Any) -> set[str]:
        response = client.get("/v1/jobs", params=params)
        assert response.status_code == 200, response.text
        return {job["id"] for job in response.json()["data"]}

    assert ids(**{"metadata.user": "ann"}) == {ann, ann_done}
    assert ids(**{"metadata.user": "ann", "metadata.batch": "1"}) == {ann}
    assert ids(status="succeeded") == {ann_done}
    assert ids(status=["queued", "succeeded"]) == {ann, bob, ann_done}
    assert ids(status="queued", **{"metadata.batch": "1"}) == {ann, bob}
    assert ids(**{"metadata.user": "carol"}) == set()
    assert client.get("/v1/jobs", params={"status": "lost"}).status_code == 422
    assert client.get("/v1/jobs", params={"limit": 1001}).status_code == 422


# --- cancelling ---


def test_cancel_queued_job_cancels_it_so_a_worker_skips_it(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    job = _submit(client)
    ends = redis.Redis.from_url(service_settings.broker_url).pubsub(ignore_subscribe_messages=True)
    ends.subscribe(ENDED_CHANNEL)

    response = client.post(f"/v1/jobs/{job['id']}/cancel")

    assert response.status_code == 200

    def announced() -> bool:  # requests waiting for it, in any API process, wake at once
        message = ends.get_message(timeout=0.1)
        return message is not None and job["id"] in ended_ids(message["data"])

    wait_for(announced, 5, "the cancelled job's end to be announced")
    ends.close()
    assert response.json()["status"] == "cancelled"
    assert response.json()["timings"]["finished_at"] is not None
    with db() as session:  # a worker claims conditionally on 'queued': the cancelled job is not claimed
        claim = update(Job).where(Job.id == job["id"], Job.status == "queued").values(status="running")
        assert session.execute(claim).rowcount == 0  # type: ignore[attr-defined]
    assert _row(db, job["id"]).status == "cancelled"


def test_cancel_running_job_asks_its_worker_to_abort(client: TestClient, db: sessionmaker[Session]) -> None:
    job = _submit(client)
    _set(db, job["id"], status="running", started_at=utcnow(), worker_id="w1", attempt=1)

    response = client.post(f"/v1/jobs/{job['id']}/cancel")

    assert response.status_code == 202
    assert response.json()["cancel_requested"] is True
    row = _row(db, job["id"])
    assert (row.status, row.cancel_requested) == ("running", True)


def test_cancel_finished_job_is_a_conflict(client: TestClient, db: sessionmaker[Session]) -> None:
    job = _submit(client)
    _set(db, job["id"], status="succeeded", finished_at=utcnow())

    response = client.post(f"/v1/jobs/{job['id']}/cancel")

    assert response.status_code == 409
    assert "already succeeded" in response.json()["detail"]
    assert _row(db, job["id"]).status == "succeeded"


# --- Prefer: wait ---


def test_prefer_wait_returns_the_job_once_it_finishes(client: TestClient, db: sessionmaker[Session]) -> None:
    job_ids: list[str] = []

    def finish_soon() -> None:
        job_ids.extend(wait_for(lambda: _job_ids(db), 10, "the submitted job", 0.01))
        time.sleep(0.3)  # the job's run: the answer must wait for its end
        _set(db, job_ids[0], status="succeeded", output_text="done", finished_at=utcnow())

    finisher = threading.Thread(target=finish_soon)
    finisher.start()
    start = time.monotonic()
    response = client.post("/v1/jobs", json={"prompt": PROMPT}, headers={"Prefer": "wait=10"})
    elapsed = time.monotonic() - start
    finisher.join()

    assert response.status_code == 200, response.text
    assert (response.json()["status"], response.json()["output"]) == ("succeeded", "done")
    assert response.headers["preference-applied"] == "wait=10"
    assert 0.3 <= elapsed < 5


def test_prefer_wait_answers_202_when_the_job_is_not_done_in_time(
    service_settings: Settings, client: TestClient
) -> None:
    start = time.monotonic()
    response = client.post("/v1/jobs", json={"prompt": PROMPT}, headers={"Prefer": "respond-async, wait=0.4"})

    assert response.status_code == 202
    assert response.json()["status"] == "queued"
    assert response.headers["preference-applied"] == "wait=0.4"
    assert 0.4 <= time.monotonic() - start < 3


def test_prefer_wait_that_runs_out_returns_the_job_as_it_is_then(
    client: TestClient, db: sessionmaker[Session]
) -> None:
    """Not the snapshot taken at submission: a worker claimed it meanwhile and has written partial output."""
    job_ids: list[str] = []

    def start_running() -> None:
        job_ids.extend(wait_for(lambda: _job_ids(db), 10, "the submitted job", 0.01))
        _set(db, job_ids[0], status="running", attempt=1, output_text="The fox", started_at=utcnow())

    runner = threading.Thread(target=start_running)
    runner.start()
    response = client.post("/v1/jobs", json={"prompt": PROMPT}, headers={"Prefer": "wait=0.5"})
    runner.join()

    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["status"], job["attempt"], job["output"]) == ("running", 1, "The fox")
    assert job["timings"]["started_at"] is not None


def test_prefer_wait_is_capped_by_max_wait_seconds(service_settings: Settings) -> None:
    capped = _changed(service_settings, {"max_wait_seconds": 0.2})
    with _client(capped) as client:
        start = time.monotonic()
        response = client.post("/v1/jobs", json={"prompt": PROMPT}, headers={"Prefer": "wait=600"})

    assert response.status_code == 202
    assert response.headers["preference-applied"] == "wait=0.2"
    assert time.monotonic() - start < 3


# --- operations ---


def test_ready_only_while_a_live_worker_serves_the_model(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    model = service_settings.served_model_name
    no_worker = f"failed: no worker serving {model} has heartbeated in the last 3 s"

    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "checks": {"database": "ok", "broker": "ok", "worker": no_worker},
        "models": {model: {"kind": "generate", "workers": 1, "live_workers": 0, "weights": None}},
    }

    with db.begin() as session:
        session.add(Worker(id="other:1", model="another-model", heartbeat_at=utcnow()))
        session.add(Worker(id="silent:1", model=model, heartbeat_at=utcnow() - timedelta(seconds=4)))
    assert client.get("/readyz").json()["checks"]["worker"] == no_worker

    with db.begin() as session:
        session.add(Worker(id="live:1", model=model, heartbeat_at=utcnow()))
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "broker": "ok", "worker": "ok"}
    assert response.json()["models"][model]["live_workers"] == 1


@pytest.mark.parametrize(
    ("setting", "url", "failing"),
    [
        ("broker_url", "redis://127.0.0.1:1/0", "broker"),
        ("database_url", "postgresql+psycopg://postgres@127.0.0.1:1/none", "database"),
    ],
)
def test_readiness_names_the_dependency_that_is_down(
    service_settings: Settings, setting: str, url: str, failing: str
) -> None:
    down = _changed(service_settings, {setting: url})
    with _client(down) as client:
        response = client.get("/readyz")

    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    body = response.json()
    assert body["status"] == "unavailable"
    working = ({"database", "broker"} - {failing}).pop()
    assert body["checks"][working] == "ok"
    assert body["checks"][failing].startswith("failed: ") and "Connection refused" in body["checks"][failing]


def test_job_routes_answer_503_while_the_database_is_down(service_settings: Settings) -> None:
    down = _changed(service_settings, {"database_url": "postgresql+psycopg://postgres@127.0.0.1:1/x"})
    with _client(down) as client:
        response = client.get("/v1/jobs/job_x")

    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert response.json() == {"detail": "the database is unavailable; retry later"}


def _samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_count_jobs_and_observe_finished_ones_once(
    client: TestClient, db: sessionmaker[Session], service_settings: Settings
) -> None:
    _, running, done = (_submit(client)["id"] for _ in range(3))
    model = service_settings.served_model_name
    now = utcnow()
    _set(db, running, status="running", started_at=now)
    _set(
        db,
        done,
        status="succeeded",
        queued_at=now - timedelta(seconds=2),
        started_at=now - timedelta(seconds=1.5),
        first_token_at=now - timedelta(seconds=1.3),
        finished_at=now,
        token_times_ms=[200.0, 230.0, 270.0, 1300.0],
        completion_tokens=4,
        cached_tokens=2,
        engine_ms=1250.0,
    )
    with db() as session:
        stats = {"num_running": 1, "num_waiting": 2, "kv_cache_usage": 0.25, "tokens_per_s": 40.5}
        session.add(Worker(id="w-live", model=model, heartbeat_at=now, stats=stats))
        session.add(Worker(id="w-dead", model=model, heartbeat_at=now - timedelta(hours=1), stats=stats))
        session.commit()

    first = _samples(client)
    second = _samples(client)

    for status, count in {"queued": 1, "running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}.items():
        assert first[("pagedq_jobs", (("status", status),))] == count
    assert first[("pagedq_queue_depth", (("model", model), ("queue", queue_name(model))))] == 3
    live = (("model", model), ("worker", "w-live"))
    assert first[("pagedq_engine_waiting_requests", live)] == 2
    assert first[("pagedq_engine_kv_cache_usage_ratio", live)] == 0.25
    assert not any(dict(labels).get("worker") == "w-dead" for _, labels in first)
    assert first[("pagedq_workers", (("model", model),))] == 1
    for samples in (first, second):  # observed once, on the first scrape only
        assert samples[("pagedq_queue_time_seconds_count", ())] == 1
        assert samples[("pagedq_queue_time_seconds_sum", ())] == pytest.approx(0.5)
        assert samples[("pagedq_time_to_first_token_seconds_sum", ())] == pytest.approx(0.2)
        assert samples[("pagedq_e2e_latency_seconds_sum", ())] == pytest.approx(2.0)
        assert samples[("pagedq_inter_token_latency_seconds_count", ())] == 3
        assert samples[("pagedq_inter_token_latency_seconds_bucket", (("le", "0.04"),))] == 2
        by_key = (("key", "none"), ("model", service_settings.served_model_name))  # auth off: no key
        assert samples[("pagedq_engine_seconds_total", by_key)] == pytest.approx(1.25)
        assert samples[("pagedq_tokens_total", (("key", "none"), ("kind", "cached"), by_key[1]))] == 2
        assert samples[("pagedq_tokens_total", (("key", "none"), ("kind", "completion"), by_key[1]))] == 4


def test_metrics_ignore_jobs_finished_before_the_api_started(
    service_settings: Settings, db: sessionmaker[Session]
) -> None:
    with _client(service_settings) as client:
        job = _submit(client)
    _set(db, job["id"], status="succeeded", started_at=utcnow(), finished_at=utcnow())

    with _client(service_settings) as client:
        late = _submit(client)
        _set(db, late["id"], status="failed", started_at=utcnow(), finished_at=utcnow())
        samples = _samples(client)

    assert samples[("pagedq_queue_time_seconds_count", ())] == 1
    assert samples[("pagedq_e2e_latency_seconds_count", ())] == 0  # only succeeded jobs count


# --- the OpenAPI document ---


def test_openapi_document_is_valid_and_declares_every_response(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()

    validate(doc)
    declared = {
        (path, method): set(operation["responses"])
        for path, operations in doc["paths"].items()
        for method, operation in operations.items()
    }
    open_to_all = {("/healthz", "get")}  # reads nothing: every other route may find the database away
    assert all("503" in codes for operation, codes in declared.items() if operation not in open_to_all)
    assert declared == {
        ("/v1/jobs", "post"): {"200", "202", "400", "404", "422", "503"},
        ("/v1/jobs", "get"): {"200", "422", "503"},
        ("/v1/jobs/{job_id}", "get"): {"200", "404", "422", "503"},
        ("/v1/jobs/{job_id}/events", "get"): {"200", "404", "422", "503"},
        ("/v1/jobs/{job_id}/cancel", "post"): {"200", "202", "404", "409", "422", "503"},
        ("/v1/jobs/{job_id}", "delete"): {"200", "404", "409", "422", "503"},
        ("/v1/files", "post"): {"200", "413", "422", "503"},
        ("/v1/files/{file_id}", "get"): {"200", "404", "422", "503"},
        ("/v1/files/{file_id}", "delete"): {"200", "404", "409", "422", "503"},
        ("/v1/files/{file_id}/content", "get"): {"200", "404", "422", "503"},
        ("/v1/batches", "post"): {"200", "400", "404", "422", "503"},
        ("/v1/batches", "get"): {"200", "422", "503"},
        ("/v1/batches/{batch_id}", "get"): {"200", "404", "422", "503"},
        ("/v1/batches/{batch_id}", "delete"): {"200", "404", "409", "422", "503"},
        ("/v1/batches/{batch_id}/cancel", "post"): {"200", "404", "409", "422", "503"},
        ("/v1/batches/{batch_id}/replay", "post"): {"202", "400", "404", "409", "422", "503"},
        ("/v1/jobs/{job_id}/webhook-deliveries", "get"): {"200", "404", "422", "503"},
        ("/v1/batches/{batch_id}/webhook-deliveries", "get"): {"200", "404", "422", "503"},
        ("/v1/jobs/{job_id}/request", "get"): {"200", "404", "422", "503"},
        ("/v1/jobs/{job_id}/manifest", "get"): {"200", "404", "422", "503"},
        ("/v1/jobs/{job_id}/replay", "post"): {"202", "404", "422", "503"},
        ("/v1/embeddings", "post"): {"200", "400", "404", "422", "503"},
        ("/v1/batches/{batch_id}/latency", "get"): {"200", "404", "422", "503"},
        ("/v1/overview", "get"): {"200", "503"},
        ("/v1/usage", "get"): {"200", "422", "503"},
        ("/v1/chat/completions", "post"): {"200", "400", "404", "422", "503"},
        ("/v1/completions", "post"): {"200", "400", "404", "422", "503"},
        ("/v1/models", "get"): {"200", "503"},
        ("/v1/models/{model_id}", "get"): {"200", "404", "422", "503"},
        ("/generate", "post"): {"200", "400", "404", "422", "503"},
        ("/healthz", "get"): {"200"},
        ("/readyz", "get"): {"200", "503"},
        ("/metrics", "get"): {"200", "503"},
        ("/v1/admin/keys", "post"): {"201", "401", "403", "409", "422", "503"},
        ("/v1/admin/keys", "get"): {"200", "401", "403", "503"},
        ("/v1/admin/keys/{name_or_id}", "delete"): {"200", "401", "403", "404", "422", "503"},
    }
    submit = doc["paths"]["/v1/jobs"]["post"]
    assert {p["name"] for p in submit["parameters"] if p["in"] == "header"} == {"Idempotency-Key", "Prefer"}
    assert "Location" in submit["responses"]["202"]["headers"]
    assert submit["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobSpec"
    }
    assert "metadata.<key>" in doc["paths"]["/v1/jobs"]["get"]["description"]
    assert all(operation.get("summary") and operation.get("tags") for operation in _operations(doc))
    invalid = [
        op["responses"]["422"]["content"]["application/json"]["schema"]
        for op in _operations(doc)
        if "422" in op["responses"]
    ]
    assert invalid and all(schema == {"$ref": "#/components/schemas/InvalidOut"} for schema in invalid)
    down = [op["responses"]["503"] for op in _operations(doc) if "503" in op["responses"]]
    assert down and all("Retry-After" in response["headers"] for response in down)
    error = {"$ref": "#/components/schemas/ErrorOut"}
    readiness = doc["paths"]["/readyz"]["get"]["responses"]["503"]
    assert all(r["content"]["application/json"]["schema"] == error for r in down if r is not readiness)


def _operations(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [operation for operations in doc["paths"].values() for operation in operations.values()]
