"""API keys, auth, per-key isolation and limits, against the real PostgreSQL, Redis and worker."""

import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from api.app import create_app
from api.http.caller import Caller, Limits
from api.http.limits import KeyLimiter, rate_window
from api.http.problems import TooMany
from core import keys
from core.models import ApiKey, Batch, Job, Worker, utcnow
from core.queue import make_celery, queue_depth, queue_name
from core.settings import Settings
from pagedq import cli
from tests.support.jobs_client import Database
from tests.support.services import Process, service_env, wait_for

PROMPT = "The quick brown fox jumps over"
BODY = {"prompt": PROMPT, "max_tokens": 4}


@pytest.fixture
def settings(service_settings: Settings) -> Settings:
    return Settings(**{**service_settings.model_dump(), "auth": "required"})


@pytest.fixture(autouse=True)
def _own_queue_dropped(settings: Settings) -> Iterator[None]:
    yield
    queue = queue_name(settings.served_model_name)
    broker = redis.Redis.from_url(settings.broker_url)
    if found := [*broker.scan_iter(f"{queue}*"), *broker.scan_iter(f"_kombu.binding*.{queue}")]:
        broker.delete(*found)


def make_key(db: Database, name: str, admin: bool = False, **limits: Any) -> str:
    with db.sessions.begin() as session:
        return keys.create(session, name, admin, limits=limits)[1]


def key_id(db: Database, name: str) -> str | None:
    with db.sessions() as session:
        return session.scalar(select(ApiKey.id).where(ApiKey.name == name))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def admin(db: Database) -> str:
    return make_key(db, "root", admin=True)


@pytest.fixture
def client(settings: Settings, admin: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def depth(settings: Settings) -> int:
    return queue_depth(make_celery(settings), queue_name(settings.served_model_name))


def count(db: Database, model: type, **where: Any) -> int:
    with db.sessions() as session:
        query = select(func.count()).select_from(model).filter_by(**where)
        return session.scalar(query) or 0


def upload(client: TestClient, key: str, lines: int) -> str:
    """A batch input file of ``lines`` completions, uploaded with ``key``."""
    body = {"prompt": PROMPT, "max_tokens": 4}
    line = {"method": "POST", "url": "/v1/completions", "body": body}
    content = "\n".join(json.dumps({**line, "custom_id": f"line-{i}"}) for i in range(lines))
    files = {"file": ("in.jsonl", io.BytesIO(content.encode()))}
    response = client.post("/v1/files", files=files, data={"purpose": "batch"}, headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.json()["id"]


# --- auth on every route ---------------------------------------------------------------------------

PUBLIC = {"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}  # open by design
ADMIN_ONLY = {"/metrics", "/readyz", "/v1/admin/keys", "/v1/admin/keys/{name_or_id}"}


def routes(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, from the app itself: a new route is tested without asking."""
    found = []
    for route in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        found += [(method, route.path) for method in sorted(route.methods or ()) if method != "HEAD"]
    return found


def call(client: TestClient, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    url = re.sub(r"\{[^}]+\}", "x", path)
    return client.request(method, url, headers=headers)


def test_every_route_but_healthz_needs_a_valid_key(client: TestClient, db: Database, admin: str) -> None:
    user = make_key(db, "user")
    revoked, expired = make_key(db, "revoked"), make_key(db, "expired")
    with db.sessions.begin() as session:
        keys.revoke(session, "revoked")
        session.execute(text("UPDATE api_keys SET expires_at = :t WHERE name = 'expired'"), {"t": utcnow()})
    served = routes(client)
    assert {path for _, path in served} >= PUBLIC | ADMIN_ONLY
    for method, path in served:
        if path in PUBLIC:
            assert call(client, method, path, {}).status_code == 200, path
            continue
        for headers, status in (
            ({}, 401),
            (bearer("pq_" + "x" * 43), 401),
            ({"Authorization": f"Basic {user}"}, 401),
            (bearer(revoked), 403),
            (bearer(expired), 403),
        ):
            response = call(client, method, path, headers)
            assert response.status_code == status, (method, path, headers, response.text)
            assert "pq_" not in response.text  # no key material in any error
            if status == 401:
                assert response.headers["WWW-Authenticate"] == "Bearer"
            if path.startswith(("/v1/chat", "/v1/completions", "/v1/models", "/v1/files", "/v1/batches")):
                assert response.json()["error"]["code"] in ("invalid_api_key", "forbidden"), path
        if path in ADMIN_ONLY:
            assert call(client, method, path, bearer(user)).status_code == 403, path
            assert call(client, method, path, bearer(admin)).status_code not in (401, 403), path
        else:
            assert call(client, method, path, bearer(user)).status_code not in (401, 403), path


# --- isolation -----------------------------------------------------------------------------------

# Every route that reads or changes one object, or lists objects: each is checked below for user B
# against user A's objects. A route that is neither must be listed in NOT_OBJECT_SCOPED.
NOT_OBJECT_SCOPED = {
    ("POST", "/v1/jobs"),  # submissions make the caller's own objects
    ("POST", "/v1/files"),
    ("POST", "/v1/batches"),  # its input_file_id is checked below
    ("POST", "/v1/chat/completions"),  # its stream is its own job's
    ("POST", "/v1/embeddings"),  # a new job of its own, answered at once
    ("POST", "/v1/completions"),
    ("POST", "/generate"),
    ("GET", "/v1/models"),
    ("GET", "/v1/usage"),  # rows scoped by key, not objects: tests/api/test_usage.py checks isolation
    ("GET", "/v1/models/{model_id:path}"),  # a served name may hold a slash (org/model)
    ("GET", "/healthz"),
    ("GET", "/readyz"),  # admin only
    ("GET", "/metrics"),  # admin only
    ("POST", "/v1/admin/keys"),  # admin only
    ("GET", "/v1/admin/keys"),
    ("DELETE", "/v1/admin/keys/{name_or_id}"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/redoc"),
}


def test_a_user_key_cannot_reach_another_keys_objects(
    client: TestClient, db: Database, admin: str, settings: Settings
) -> None:
    alice, bob = make_key(db, "alice"), make_key(db, "bob")
    a, b = bearer(alice), bearer(bob)
    job = client.post("/v1/jobs", json=BODY, headers=a).json()["id"]
    file = upload(client, alice, 2)
    batch = client.post(
        "/v1/batches",
        json={"input_file_id": file, "endpoint": "/v1/completions", "completion_window": "24h"},
        headers=a,
    ).json()["id"]
    alice_id = keys.hashed(alice)
    with db.sessions() as session:
        owner = session.scalar(select(ApiKey.id).where(ApiKey.key_hash == alice_id))
        assert session.scalar(select(Batch.key_id).where(Batch.id == batch)) == owner
        assert set(session.scalars(select(Job.key_id).where(Job.batch_id == batch))) == {owner}
    missing = {"job": "job_missing", "file": "file-missing", "batch": "batch_missing"}

    checks: dict[tuple[str, str], Callable[[dict[str, str], dict[str, str]], httpx.Response]] = {
        ("GET", "/v1/jobs/{job_id}"): lambda h, o: client.get(f"/v1/jobs/{o['job']}", headers=h),
        ("GET", "/v1/jobs/{job_id}/events"): lambda h, o: client.get(
            f"/v1/jobs/{o['job']}/events", headers=h
        ),
        ("POST", "/v1/jobs/{job_id}/cancel"): lambda h, o: client.post(
            f"/v1/jobs/{o['job']}/cancel", headers=h
        ),
        ("DELETE", "/v1/jobs/{job_id}"): lambda h, o: client.delete(f"/v1/jobs/{o['job']}", headers=h),
        ("GET", "/v1/jobs/{job_id}/manifest"): lambda h, o: client.get(
            f"/v1/jobs/{o['job']}/manifest", headers=h
        ),
        ("POST", "/v1/jobs/{job_id}/replay"): lambda h, o: client.post(
            f"/v1/jobs/{o['job']}/replay", headers=h
        ),
        ("GET", "/v1/jobs/{job_id}/request"): lambda h, o: client.get(
            f"/v1/jobs/{o['job']}/request", headers=h
        ),
        ("GET", "/v1/jobs/{job_id}/webhook-deliveries"): lambda h, o: client.get(
            f"/v1/jobs/{o['job']}/webhook-deliveries", headers=h
        ),
        ("GET", "/v1/files/{file_id}"): lambda h, o: client.get(f"/v1/files/{o['file']}", headers=h),
        ("GET", "/v1/files/{file_id}/content"): lambda h, o: client.get(
            f"/v1/files/{o['file']}/content", headers=h
        ),
        ("DELETE", "/v1/files/{file_id}"): lambda h, o: client.delete(f"/v1/files/{o['file']}", headers=h),
        ("GET", "/v1/batches/{batch_id}"): lambda h, o: client.get(f"/v1/batches/{o['batch']}", headers=h),
        ("POST", "/v1/batches/{batch_id}/cancel"): lambda h, o: client.post(
            f"/v1/batches/{o['batch']}/cancel", headers=h
        ),
        ("DELETE", "/v1/batches/{batch_id}"): lambda h, o: client.delete(
            f"/v1/batches/{o['batch']}", headers=h
        ),
        ("POST", "/v1/batches/{batch_id}/replay"): lambda h, o: client.post(
            f"/v1/batches/{o['batch']}/replay", headers=h
        ),
        ("GET", "/v1/batches/{batch_id}/latency"): lambda h, o: client.get(
            f"/v1/batches/{o['batch']}/latency", headers=h
        ),
        ("GET", "/v1/batches/{batch_id}/webhook-deliveries"): lambda h, o: client.get(
            f"/v1/batches/{o['batch']}/webhook-deliveries", headers=h
        ),
    }
    lists = {  # what each caller is shown: ids, or the states its jobs are in (the console's overview)
        ("GET", "/v1/overview"): lambda h: {
            state for state, count in client.get("/v1/overview", headers=h).json()["jobs"].items() if count
        },
        ("GET", "/v1/jobs"): lambda h: {j["id"] for j in client.get("/v1/jobs", headers=h).json()["data"]},
        ("GET", "/v1/batches"): lambda h: {
            x["id"] for x in client.get("/v1/batches", headers=h).json()["data"]
        },
    }
    served = set(routes(client))
    forgotten = served - checks.keys() - lists.keys() - NOT_OBJECT_SCOPED
    assert not forgotten, f"routes neither checked for isolation nor listed as not object-scoped: {forgotten}"

    objects = {"job": job, "file": file, "batch": batch}
    for route, check in checks.items():
        theirs, absent = check(b, objects), check(b, missing)
        assert theirs.status_code == absent.status_code == 404, (route, theirs.text)
        kind = {"jobs": "job", "files": "file", "batches": "batch"}[route[1].split("/")[2]]
        same = theirs.text.replace(objects[kind], "ID") == absent.text.replace(missing[kind], "ID")
        assert same, (route, theirs.text, absent.text)  # as missing as a missing one
    for route, listed in lists.items():
        assert listed(b) == set(), route
        assert listed(a) and listed(bearer(admin)) >= listed(a), route
    assert client.get(f"/v1/jobs?batch_id={batch}", headers=b).json()["data"] == []

    def ids(headers: dict[str, str], key: str) -> set[str]:
        return {j["id"] for j in client.get("/v1/jobs", params={"key": key}, headers=headers).json()["data"]}

    assert job in ids(bearer(admin), "alice") == ids(bearer(admin), owner) == ids(a, "alice")  # name or id
    assert ids(bearer(admin), "bob") == ids(b, "alice") == ids(a, "bob") == ids(a, "nobody") == set()
    mine = client.get(f"/v1/jobs/{job}", headers=a).json()
    assert mine["key_id"] == owner and alice not in str(mine)  # its key's id, never the key
    taken = {"input_file_id": file, "endpoint": "/v1/completions", "completion_window": "24h"}
    assert client.post("/v1/batches", json=taken, headers=b).status_code == 404  # not a file of bob's
    assert [j.status for j in db.jobs([job])] == ["queued"]  # bob's cancel did nothing
    assert client.get(f"/v1/files/{file}/content", headers=a).status_code == 200
    assert client.get(f"/v1/batches/{batch}", headers=a).status_code == 200  # bob's delete did nothing
    running = client.post(f"/v1/batches/{batch}/replay", headers=a)  # no worker here: it never ends
    assert running.status_code == 409 and "replay it once it has ended" in running.json()["detail"]
    assert client.get(f"/v1/jobs/{job}", headers=bearer(admin)).status_code == 200  # admins see all
    with db.sessions() as session:  # key material is in no row: only its hash
        dump = " ".join(str(row) for row in session.execute(text("SELECT * FROM jobs")).all())
        dump += " ".join(str(row) for row in session.execute(text("SELECT * FROM api_keys")).all())
    assert alice not in dump and bob not in dump and alice_id in dump


# --- managing keys -------------------------------------------------------------------------------


def test_a_user_keys_overview_is_its_own_queue_and_no_workers(
    client: TestClient, db: Database, admin: str
) -> None:
    alice, bob = bearer(make_key(db, "alice")), bearer(make_key(db, "bob"))
    for _ in range(2):
        assert client.post("/v1/jobs", json=BODY, headers=alice).status_code == 202
    with db.sessions() as session, session.begin():
        session.add(Worker(id="gpu-7.internal:4242", model="m", stats={"num_running": 3.0}))

    def seen(headers: dict[str, str]) -> dict[str, Any]:
        return client.get("/v1/overview", headers=headers).json()

    everything = seen(bearer(admin))
    assert everything["scope"] == "all"
    assert [w["id"] for w in everything["workers"]] == ["gpu-7.internal:4242"]
    assert everything["queue_depth"] == 2  # the broker's messages
    for headers, queued in ((alice, 2), (bob, 0)):
        mine = seen(headers)
        assert mine["scope"] == "key" and mine["workers"] == [] and "gpu-7" not in str(mine)
        assert mine["queue_depth"] == mine["jobs"]["queued"] == queued
        assert (mine["oldest_queued_age_s"] is None) == (queued == 0)


def test_keys_are_made_listed_and_revoked_by_the_cli_and_the_admin_routes(
    client: TestClient,
    db: Database,
    admin: str,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in service_env(settings).items():
        if name.startswith("PAGEDQ_"):
            monkeypatch.setenv(name, value)
    assert cli.main(["keys", "create", "--name", "ci", "--expires-in", "30d"]) == 0
    key = capsys.readouterr().out.split()[0]
    assert key.startswith("pq_") and len(key) >= 3 + 43
    assert client.get("/v1/jobs", headers=bearer(key)).status_code == 200
    assert cli.main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    assert "ci" in listing and key[:10] in listing and key not in listing and "expires" in listing
    assert cli.main(["keys", "create", "--name", "ci"]) == 1  # names are unique
    assert cli.main(["keys", "revoke", "ci"]) == 0
    assert client.get("/v1/jobs", headers=bearer(key)).status_code == 403

    made = client.post("/v1/admin/keys", json={"name": "svc", "max_active_jobs": 3}, headers=bearer(admin))
    assert made.status_code == 201, made.text
    svc = made.json()["key"]
    assert client.get("/v1/jobs", headers=bearer(svc)).status_code == 200
    listed = client.get("/v1/admin/keys", headers=bearer(admin)).json()["data"]
    assert {k["name"] for k in listed} >= {"root", "ci", "svc"} and svc not in json.dumps(listed)
    assert next(k for k in listed if k["name"] == "svc")["max_active_jobs"] == 3
    assert next(k for k in listed if k["name"] == "svc")["last_used_at"] is not None  # it was used
    assert client.delete(f"/v1/admin/keys/{made.json()['id']}", headers=bearer(admin)).status_code == 200
    assert client.get("/v1/jobs", headers=bearer(svc)).status_code == 403
    with db.sessions() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.name == "svc"))
        assert row is not None and row.key_hash == hashlib.sha256(svc.encode()).hexdigest()


def test_auth_is_required_beyond_loopback_and_a_first_start_needs_an_admin_key(
    service_settings: Settings, db: Database
) -> None:
    assert not Settings(host="127.0.0.1").auth_required and Settings(host="0.0.0.0").auth_required
    assert Settings(host="127.0.0.1", auth="required").auth_required
    assert not Settings(host="0.0.0.0", auth="off").auth_required
    exposed = Settings(**{**service_settings.model_dump(), "host": "0.0.0.0"})
    with pytest.raises(keys.NoAdminKey, match="PAGEDQ_ADMIN_KEY"):
        create_app(exposed)
    with pytest.raises(keys.NoAdminKey, match="43"):
        create_app(exposed.model_copy(update={"admin_key": "pq_short"}))
    bootstrap = keys.new_key()
    with TestClient(create_app(exposed.model_copy(update={"admin_key": bootstrap}))) as c:
        assert c.get("/v1/jobs").status_code == 401
        assert c.get("/metrics", headers=bearer(bootstrap)).status_code == 200
        assert c.get("/healthz").status_code == 200


# --- limits -------------------------------------------------------------------------------------


def refused_after_some(client: TestClient, key: str, tries: int, **body: Any) -> tuple[int, httpx.Response]:
    """Submits until one is refused; how many were accepted, and the refusal."""
    for accepted in range(tries):
        response = client.post("/v1/jobs", json={**BODY, **body}, headers=bearer(key))
        if response.status_code != 202:
            return accepted, response
    raise AssertionError(f"{tries} submissions, none refused")


def test_each_rate_limit_is_a_429_with_retry_after_and_enqueues_nothing(
    client: TestClient, db: Database, settings: Settings
) -> None:
    fast = make_key(db, "fast", requests_per_second=1)
    accepted, refused = refused_after_some(client, fast, 5)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["x-ratelimit-limit-requests"] == "1"
    assert (
        refused.headers["x-ratelimit-remaining-requests"] == "0"
        and "x-ratelimit-reset-requests" in refused.headers
    )
    assert "1 requests per second" in refused.json()["detail"]

    hungry = make_key(db, "hungry", tokens_per_minute=30)  # a submission costs its prompt + max_tokens 20
    accepted_tokens, refused = refused_after_some(client, hungry, 3, max_tokens=20)
    assert refused.status_code == 429 and refused.headers["x-ratelimit-limit-tokens"] == "30"
    assert int(refused.headers["Retry-After"]) >= 1
    assert count(db, Job, key_id=key_id(db, "fast")) == accepted
    assert count(db, Job, key_id=key_id(db, "hungry")) == accepted_tokens
    assert depth(settings) == accepted + accepted_tokens  # nothing of a refusal reached the queue

    small = make_key(db, "small", max_tokens=8, max_n=2, max_prompt_tokens=5)
    for body, name in (
        ({"max_tokens": 9}, "max_tokens"),
        ({"n": 3}, "n"),
        ({"prompt": PROMPT * 3}, "prompt"),
    ):
        response = client.post("/v1/jobs", json={**BODY, **body}, headers=bearer(small))
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", name], body
    openai_body = {"model": settings.served_model_name, "prompt": PROMPT, "max_tokens": 9}
    response = client.post("/v1/completions", json=openai_body, headers=bearer(small))
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    assert count(db, Job, key_id=key_id(db, "small")) == 0


def test_a_fractional_rate_is_enforced_as_given(client: TestClient, db: Database) -> None:
    assert [(w.amount, w.multiples) for w in map(rate_window, (1.5, 0.25, 50.0, 0.001))] == [
        (3, 2),
        (1, 4),
        (50, 1),
        (1, 1),
    ]
    key = make_key(db, "one-and-a-half", requests_per_second=1.5)
    accepted, refused = refused_after_some(client, key, 8)
    assert accepted >= 3 and refused.status_code == 429  # 1.5/s: 3 in a window of 2 s, not 1 a second
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    assert "3 requests per 2 seconds" in refused.json()["detail"]


def test_max_active_jobs_refuses_a_job_or_a_whole_batch_and_a_cancel_releases_a_share(
    client: TestClient, db: Database, settings: Settings
) -> None:
    key = make_key(db, "busy", max_active_jobs=3)
    first = [client.post("/v1/jobs", json=BODY, headers=bearer(key)).json()["id"] for _ in range(2)]
    file = upload(client, key, 2)
    batch = {"input_file_id": file, "endpoint": "/v1/completions", "completion_window": "24h"}
    refused = client.post("/v1/batches", json=batch, headers=bearer(key))  # 2 + 2 lines > 3
    assert refused.status_code == 429 and refused.headers["Retry-After"]
    assert "max_active_jobs" in refused.json()["error"]["message"] and "adds 2" in refused.json()["detail"]
    assert count(db, Batch) == 0 and count(db, Job) == 2 and depth(settings) == 2  # no partial batch
    assert client.post("/v1/jobs", json=BODY, headers=bearer(key)).status_code == 202  # the third
    refused = client.post("/v1/jobs", json=BODY, headers=bearer(key))
    assert refused.status_code == 429 and refused.headers["x-ratelimit-limit-active-jobs"] == "3"
    assert count(db, Job) == 3 and depth(settings) == 3
    assert client.post(f"/v1/jobs/{first[0]}/cancel", headers=bearer(key)).status_code == 200
    assert client.post("/v1/jobs", json=BODY, headers=bearer(key)).status_code == 202  # its share is back


# --- a real worker: the openai SDK, and a killed worker's share ------------------------------------


def test_openai_sdk_with_a_key_and_a_killed_worker_releases_its_share(
    client: TestClient, db: Database, settings: Settings, tmp_path: Path
) -> None:
    key = make_key(db, "sdk", max_active_jobs=1)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)
    wrong = openai.OpenAI(
        base_url="http://testserver/v1", api_key="pq_wrong", http_client=client, max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=settings.served_model_name, prompt=PROMPT, max_tokens=2)
    long = {**BODY, "max_tokens": 900, "ignore_eos": True}
    job_id = client.post("/v1/jobs", json=long, headers=bearer(key)).json()["id"]
    with pytest.raises(openai.RateLimitError):  # the key's one share is taken by the queued job
        sdk.completions.create(model=settings.served_model_name, prompt=PROMPT, max_tokens=2)

    dying = settings.model_copy(update={"max_attempts": 1})
    pair = [Process(["worker"], service_env(dying), tmp_path / f"worker{i}.log") for i in range(2)]
    try:
        wait_for(lambda: all(db.worker_stats(w.popen.pid) for w in pair), 120, "both workers to register")
        wait_for(lambda: db.jobs([job_id])[0].completion_tokens > 0, 60, "the job to start")
        owner = db.jobs([job_id])[0].worker_id or ""
        [running] = [w for w in pair if owner.endswith(f":{w.popen.pid}")]
        running.kill()  # its run was the job's last allowed: the other worker's reconciler fails it
        db.wait_until([job_id], {"failed"}, timeout=30)
        completion = sdk.completions.create(model=settings.served_model_name, prompt=PROMPT, max_tokens=2)
        assert completion.object == "text_completion" and 1 <= completion.usage.completion_tokens <= 2
    finally:
        for worker in pair:
            worker.stop()


def test_the_embedded_mode_counts_rates_in_memory() -> None:
    limits = Limits(100, 1.0, 30, None, 16, None)
    limiter, caller = KeyLimiter(None), Caller(key_id="key_embedded", admin=False, limits=limits, name="e")
    limiter.tokens(caller, 30)
    with pytest.raises(TooMany) as refused:
        limiter.tokens(caller, 1)
    assert (
        refused.value.headers["x-ratelimit-limit-tokens"] == "30"
        and int(refused.value.headers["Retry-After"]) >= 1
    )
    limiter.tokens(Caller(key_id="key_other", admin=False, limits=limits), 30)  # each key its own window
