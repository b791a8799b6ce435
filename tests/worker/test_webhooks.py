"""Webhooks: Standard Webhooks signatures, retries, refusals and the outbox, against real services.

The receiver is a local HTTP server in a thread answering from a script; deliveries go out through a
real ``pagedq webhooks`` process (and a real ``pagedq worker`` where a job must run).
"""

import base64
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address, IPv6Address, ip_address
from pathlib import Path
from typing import Any

import pytest
import standardwebhooks
from fastapi.testclient import TestClient
from openai import OpenAI
from sqlalchemy import select, update

import core.webhooks
from core.models import Batch, File, Job, WebhookDelivery, Worker, utcnow
from core.settings import Settings
from core.special_addresses import IPV4_SPECIAL, IPV6_SPECIAL, Address, SpecialRange, special_range
from core.states import JobStatus
from core.webhooks import Outbox, WebhookRefused, checked_address, parse_webhook_url, record_event
from tests.support.jobs_client import Database, api_client, start_worker, submit
from tests.support.services import Process, service_env, wait_for
from worker.store import JobStore, Progress
from worker.webhooks import Attempt, Sender, backoff, load_secret, next_step, retry_after_seconds, sign

SECRET = "whsec_" + base64.b64encode(b"pagedq webhook test secret 32 by").decode()


# --- the receiver ---


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


class Receiver:
    """An HTTP endpoint answering each path from a script of (status, headers); 200 when none is left."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.received: list[Received] = []
        self.scripts: dict[str, list[tuple[int, dict[str, str]]]] = {}
        self.delays: dict[str, float] = {}  # seconds a path takes to answer
        self.words: dict[str, str] = {}  # a reason phrase and body a path answers with
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, port), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {key.lower(): value for key, value in self.headers.items()}
                with receiver.lock:
                    receiver.received.append(Received(self.path, headers, body, time.monotonic()))
                    script = receiver.scripts.get(self.path) or [(200, {})]
                    status, extra = script.pop(0)
                time.sleep(receiver.delays.get(self.path, 0.0))
                words = receiver.words.get(self.path)
                self.send_response(status, words)
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(words.encode()) if words else 0))
                self.end_headers()
                if words:
                    self.wfile.write(words.encode())

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def script(self, path: str, *responses: tuple[int, dict[str, str]]) -> str:
        self.scripts[path] = list(responses)
        return self.url(path)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def wait(
        self, path: str, count: int, sender: Process | None = None, timeout: float = 30
    ) -> list[Received]:
        try:
            wait_for(lambda: len(self.at(path)) >= count, timeout, f"{count} request(s) to {path}")
        except AssertionError as error:
            raise AssertionError(f"{error}\n{sender.log()[-4000:] if sender else ''}") from None
        return self.at(path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def settings(service_settings: Settings) -> Settings:
    """Loopback endpoints allowed, a fixed secret, fast retries, and a webhook queue of this test's own."""
    return service_settings.model_copy(
        update={
            "webhook_allow_private": True,
            "webhook_secret": SECRET,
            "webhook_backoff_base": 0.2,
            "webhook_queue": "pagedq.webhooks." + Path(service_settings.model).name,
        }
    )


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


def start_sender(settings: Settings, processes: list[Process], log: Path) -> Process:
    sender = Process(["webhooks"], service_env(settings), log)
    processes.append(sender)
    return sender


def deliveries(client: TestClient, job_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/jobs/{job_id}/webhook-deliveries")
    assert response.status_code == 200, response.text
    return response.json()["data"]


def settled(client: TestClient, job_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The job's deliveries once ``count`` of them are no longer pending."""

    def done() -> list[dict[str, Any]] | None:
        found = deliveries(client, job_id)
        return found if sum(d["status"] != "pending" for d in found) >= count else None

    return wait_for(done, 30, f"{count} deliveries of {job_id} to settle", interval=0.1)  # type: ignore[return-value]


def cancelled_job(client: TestClient, **body: Any) -> str:
    """A job cancelled while queued (no worker runs): its job.cancelled event is recorded at once."""
    job_id = submit(client, prompt="hello", max_tokens=4, **body)
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    return job_id


# --- end to end ---


def test_a_finished_job_is_announced_signed_per_standard_webhooks_and_openai_unwraps_it(
    settings, receiver, db, processes, tmp_path
):
    settings = settings.model_copy(update={"webhook_url": receiver.url("/global")})
    processes.append(start_worker(settings, db, tmp_path / "worker.log"))
    sender = start_sender(settings, processes, tmp_path / "webhooks.log")
    with api_client(settings) as client:
        job_id = submit(
            client,
            prompt="hello",
            max_tokens=4,
            ignore_eos=True,
            metadata={"user": "ann"},
            webhook_url=receiver.url("/job"),
        )
        [own] = receiver.wait("/job", 1, sender)
        [everything] = receiver.wait("/global", 1, sender)
        recorded = settled(client, job_id, count=2)
    [job] = db.jobs([job_id])

    payload = standardwebhooks.Webhook(SECRET).verify(own.body, own.headers)
    assert payload["object"] == "event" and payload["type"] == "job.succeeded"
    assert payload["id"].startswith("evt_") and abs(payload["created_at"] - time.time()) < 120
    data = payload["data"]
    assert (data["id"], data["status"], data["output"]) == (job_id, "succeeded", job.output_text)
    assert data["usage"]["completion_tokens"] == 4 and data["metadata"] == {"user": "ann"}
    event = OpenAI(api_key="x", webhook_secret=SECRET).webhooks.unwrap(everything.body, everything.headers)
    assert event.type == "job.succeeded" and event.data.id == job_id and event.id == payload["id"]

    assert {d["url"]: d["status"] for d in recorded} == {
        receiver.url("/job"): "delivered",
        receiver.url("/global"): "delivered",
    }
    assert {d["id"] for d in recorded} == {own.headers["webhook-id"], everything.headers["webhook-id"]}
    assert all([a["status_code"] for a in d["attempts"]] == [200] for d in recorded)


def test_a_5xx_is_retried_with_the_same_webhook_id_and_every_attempt_is_recorded(
    settings, receiver, processes, tmp_path
):
    sender = start_sender(settings, processes, tmp_path / "webhooks.log")
    url = receiver.script("/flaky", (500, {}), (200, {}))
    with api_client(settings) as client:
        job_id = cancelled_job(client, webhook_url=url)
        first, second = receiver.wait("/flaky", 2, sender)
        [delivery] = settled(client, job_id)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery["id"]
    assert first.body == second.body and first.payload["type"] == "job.cancelled"
    for request in (first, second):
        standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)
    assert delivery["status"] == "delivered"
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 200]
    assert "500" in delivery["attempts"][0]["error"] and delivery["attempts"][1]["error"] is None
    assert delivery["next_attempt_at"] is None


def test_a_410_stops_retries_at_once(settings, receiver, processes, tmp_path):
    sender = start_sender(settings, processes, tmp_path / "webhooks.log")
    url = receiver.script("/gone", (410, {}), (200, {}))
    with api_client(settings) as client:
        job_id = cancelled_job(client, webhook_url=url)
        [delivery] = settled(client, job_id)
    assert delivery["status"] == "failed", sender.log()[-3000:]
    assert [a["status_code"] for a in delivery["attempts"]] == [410]
    assert len(receiver.at("/gone")) == 1


def test_a_429_retry_after_is_honoured(settings, receiver, processes, tmp_path):
    sender = start_sender(settings, processes, tmp_path / "webhooks.log")
    url = receiver.script("/busy", (429, {"Retry-After": "2"}), (200, {}))
    with api_client(settings) as client:
        job_id = cancelled_job(client, webhook_url=url)
        first, second = receiver.wait("/busy", 2, sender)
        [delivery] = settled(client, job_id)
    assert second.at - first.at >= 2.0  # the backoff alone would have waited about 0.2 s
    assert [a["status_code"] for a in delivery["attempts"]] == [429, 200]


def test_cancelling_a_queued_job_announces_it_to_the_endpoints_whose_events_include_it(
    settings, receiver, processes, tmp_path
):
    settings = settings.model_copy(update={"webhook_url": receiver.url("/global")})
    sender = start_sender(settings, processes, tmp_path / "webhooks.log")
    with api_client(settings) as client:
        wanted = cancelled_job(client, webhook_url=receiver.url("/job"), webhook_events=["job.cancelled"])
        unwanted = cancelled_job(client, webhook_url=receiver.url("/job"), webhook_events=["job.succeeded"])
        assert client.get(f"/v1/jobs/{unwanted}").json()["webhook_events"] == ["job.succeeded"]
        [own] = receiver.wait("/job", 1, sender)
        receiver.wait("/global", 2, sender)
        settled(client, unwanted)
        assert [d["url"] for d in deliveries(client, unwanted)] == [receiver.url("/global")]
    assert own.payload["type"] == "job.cancelled"
    assert (own.payload["data"]["id"], own.payload["data"]["status"]) == (wanted, "cancelled")
    assert {r.payload["data"]["id"] for r in receiver.at("/global")} == {wanted, unwanted}


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://127.0.0.1",
        "http://localhost:9/x",
        "http://[::1]/",
        "http://169.254.169.254/",
        "http://100.100.100.200/",
        "http://[::ffff:169.254.169.254]/",
    ],
)
def test_private_webhook_urls_are_refused_at_submission(service_settings, url):
    with api_client(service_settings) as client:
        response = client.post("/v1/jobs", json={"prompt": "hi", "webhook_url": url})
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "webhook_url"] and "PAGEDQ_WEBHOOK_ALLOW_PRIVATE" in problem["msg"]


def test_bad_webhook_fields_are_refused_and_a_public_address_is_accepted(service_settings):
    with api_client(service_settings) as client:
        scheme = client.post("/v1/jobs", json={"prompt": "hi", "webhook_url": "ftp://example.com/x"})
        event = client.post("/v1/jobs", json={"prompt": "hi", "webhook_events": ["job.started"]})
        public = client.post("/v1/jobs", json={"prompt": "hi", "webhook_url": "http://93.184.215.14/hook"})
    assert scheme.status_code == 422 and "http" in scheme.json()["detail"][0]["msg"]
    assert event.status_code == 422 and "job.succeeded" in event.json()["detail"][0]["msg"]
    assert public.status_code == 202, public.text


def test_the_sender_refuses_a_private_address_once_without_retrying(settings, receiver, processes, tmp_path):
    sender = start_sender(
        settings.model_copy(update={"webhook_allow_private": False}), processes, tmp_path / "w.log"
    )
    with api_client(settings) as client:  # the API allowed it; the sender, checking again, does not
        job_id = cancelled_job(client, webhook_url=receiver.url("/private"))
        [delivery] = settled(client, job_id)
    assert delivery["status"] == "failed", sender.log()[-3000:]
    [attempt] = delivery["attempts"]
    assert (attempt["status_code"], attempt["latency_ms"], attempt["error"]) == (None, 0, "refused")
    assert receiver.at("/private") == []
    assert "Loopback (127.0.0.0/8, RFC 1122)" in sender.log()  # the why is the operator's, in the log


def test_a_host_that_does_not_resolve_is_refused_at_submission_and_no_job_is_made(settings, db):
    settings = settings.model_copy(update={"webhook_resolve_timeout": 1.0})
    url = "https://hooks.no-such-host.invalid/x?token=abc"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
    with api_client(settings) as client:
        job = client.post("/v1/jobs", json={"prompt": "hi", "webhook_url": url})
        file_id = client.post(
            "/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode())}, data={"purpose": "batch"}
        ).json()["id"]
        batch = client.post(
            "/v1/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/completions",
                "completion_window": "24h",
                "webhook_url": url,
            },
        )
    assert job.status_code == 422, job.text
    [problem] = job.json()["detail"]
    assert problem["loc"] == ["body", "webhook_url"] and problem["type"] == "webhook_url_unresolvable"
    assert "'hooks.no-such-host.invalid' does not resolve" in problem["msg"]
    assert batch.status_code == 422, batch.text
    error = batch.json()["error"]
    assert error["param"] == "webhook_url" and "does not resolve" in error["message"]
    with db.sessions() as session:
        assert session.scalars(select(Job.id)).all() == [] and session.scalars(select(Batch.id)).all() == []


def job_with_webhook(db: Database, settings: Settings, url: str) -> str:
    """A failed job whose job.failed delivery to ``url`` is recorded, as the worker would; its id."""
    with db.sessions.begin() as session:
        job = Job(model="tiny", prompt_token_ids=[1], params={}, status="failed", webhook_url=url)
        session.add(job)
        session.flush()
        [delivery_id] = record_event(session, settings, "job.failed", job=job)
    return delivery_id


def test_the_sender_connects_to_the_address_it_checked_not_to_a_second_lookups(settings, db, monkeypatch):
    """DNS rebinding: the host answers a public address to the check and a private one after. The resolver
    is this process's ``getaddrinfo``; 127.0.0.1 stands for the public address, 127.0.0.2 for the private."""
    checked = Receiver("127.0.0.1")
    port = checked.server.server_port
    rebound = Receiver("127.0.0.2", port)
    lookups: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def rebinding_dns(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "rebind.test":
            return real_getaddrinfo(host, *args, **kwargs)
        lookups.append(host)
        address = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_dns)
    loopback = special_range(IPv4Address("127.0.0.2"))
    monkeypatch.setattr(
        core.webhooks, "special_range", lambda address: None if str(address) == "127.0.0.1" else loopback
    )
    settings = settings.model_copy(update={"webhook_allow_private": False})
    delivery_id = job_with_webhook(db, settings, f"http://rebind.test:{port}/hook?token=t")
    sender = Sender(db.sessions, settings, SECRET, lambda delivery, at: None)
    try:
        sender.deliver(delivery_id)
    finally:
        sender.close()
        checked.close()
        rebound.close()
    [request] = checked.at("/hook?token=t")
    assert request.headers["host"] == f"rebind.test:{port}" and rebound.received == []
    assert lookups == ["rebind.test"]
    standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)


def test_a_failed_delivery_records_no_words_of_the_endpoint(settings, db, receiver):
    settings = settings.model_copy(update={"webhook_max_attempts": 1})
    url = receiver.script("/leaky", (500, {}))
    receiver.words["/leaky"] = "Traceback: db password=hunter2"
    delivery_id = job_with_webhook(db, settings, url)
    sender = Sender(db.sessions, settings, SECRET, lambda delivery, at: None)
    sender.deliver(delivery_id)
    sender.close()
    with db.sessions() as session:
        job_id = session.get_one(WebhookDelivery, delivery_id).job_id
    with api_client(settings) as client:
        response = client.get(f"/v1/jobs/{job_id}/webhook-deliveries")
    [attempt] = response.json()["data"][0]["attempts"]
    assert (attempt["status_code"], attempt["error"]) == (500, "HTTP 500") and attempt["latency_ms"] > 0
    assert "hunter2" not in response.text and len(receiver.at("/leaky")) == 1


def test_a_delivery_whose_message_was_lost_is_swept_and_sent(settings, receiver, db, processes, tmp_path):
    with api_client(settings) as client:
        job_id = submit(client, prompt="hi", max_tokens=4)
    with db.sessions.begin() as session:  # recorded but never published, as after a broker failure
        job = session.get_one(Job, job_id)
        job.webhook_url = receiver.url("/swept")
        [delivery_id] = record_event(session, settings, "job.failed", job=job)
    sender = start_sender(settings, processes, tmp_path / "webhooks.log")
    [request] = receiver.wait("/swept", 1, sender)
    assert request.headers["webhook-id"] == delivery_id


def test_a_duplicate_message_never_sends_an_event_twice(settings, receiver, db):
    receiver.delays["/once"] = 0.5  # so that the duplicates overlap the first attempt
    with api_client(settings) as client:
        job_id = cancelled_job(client, webhook_url=receiver.url("/once"))
    [delivery_id] = [d.id for d in db_deliveries(db, job_id)]
    retries: list[str] = []
    sender = Sender(db.sessions, settings, SECRET, lambda delivery, at: retries.append(delivery))
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(sender.deliver, [delivery_id] * 4))
    sender.deliver(delivery_id)
    sender.close()
    assert len(receiver.at("/once")) == 1 and retries == []
    [delivery] = db_deliveries(db, job_id)
    assert delivery.status == "delivered" and len(delivery.attempts) == 1


class Published:
    """Celery's place in an ``Outbox``: keeps the delivery ids the store publishes."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def send_task(self, name: str, args: list[str], **options: object) -> None:
        self.ids.extend(args)


def db_deliveries(db: Database, job_id: str) -> list[WebhookDelivery]:
    with db.sessions() as session:
        return list(session.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)))


def test_the_worker_records_an_event_only_for_the_write_that_ends_the_job(settings, db, receiver):
    broker = Published()
    published = broker.ids
    store = JobStore(db.sessions, "tiny", Outbox(settings, broker))  # type: ignore[arg-type]
    with db.sessions.begin() as session:
        job = Job(model="tiny", prompt_token_ids=[1], params={}, webhook_url=receiver.url("/w"))
        orphan = Job(model="tiny", prompt_token_ids=[1], params={}, webhook_url=receiver.url("/w"))
        session.add_all([job, orphan])
    run = store.claim(job.id, "w1")
    assert run is not None
    store.write([Progress(job.id, run.attempt, "partial", 1)])
    store.write([Progress(job.id, run.attempt - 1, "stale", 1, status=JobStatus.FAILED)])
    assert published == [] and db_deliveries(db, job.id) == []
    store.write([Progress(job.id, run.attempt, "done", 2, status=JobStatus.SUCCEEDED)])
    [succeeded] = db_deliveries(db, job.id)
    assert succeeded.event_type == "job.succeeded" and succeeded.payload["data"]["output"] == "done"

    store.claim(orphan.id, "gone")  # its worker never heartbeats, and it was asked to cancel
    with db.sessions.begin() as session:
        session.execute(update(Job).where(Job.id == orphan.id).values(cancel_requested=True))
        session.execute(update(Worker).values(heartbeat_at=utcnow() - timedelta(minutes=5)))
    store.requeue_orphans(heartbeat_timeout=30)
    [cancelled] = db_deliveries(db, orphan.id)
    assert cancelled.event_type == "job.cancelled"
    assert published == [succeeded.id, cancelled.id]


@pytest.mark.parametrize("global_endpoint", [False, True])
def test_the_worker_announces_each_job_an_endpoint_hears_of_and_reads_no_other(
    settings, db, receiver, global_endpoint
):
    """The write that ends jobs reads only those an endpoint may hear of (``Outbox.jobs_heard``): a job
    with a URL of its own; with a global endpoint, every job."""
    if global_endpoint:
        settings = settings.model_copy(update={"webhook_url": receiver.url("/global")})
    loaded: list[str] = []

    class Listening(Outbox):
        def record(self, session, event_type, *, job=None, batch=None):  # type: ignore[no-untyped-def]
            loaded.append(job.id)
            return super().record(session, event_type, job=job, batch=batch)

    store = JobStore(db.sessions, "tiny", Listening(settings, Published()))  # type: ignore[arg-type]
    with db.sessions.begin() as session:
        own = Job(model="tiny", prompt_token_ids=[1], params={}, webhook_url=receiver.url("/own"))
        bare = Job(model="tiny", prompt_token_ids=[1], params={})
        session.add_all([own, bare])
    runs = [store.claim(job.id, "w1") for job in (own, bare)]
    store.write([Progress(run.id, run.attempt, "done", 1, status=JobStatus.SUCCEEDED) for run in runs])
    urls = {job.id: sorted(d.url for d in db_deliveries(db, job.id)) for job in (own, bare)}
    if global_endpoint:
        assert sorted(loaded) == sorted([own.id, bare.id])
        assert urls == {
            own.id: sorted([receiver.url("/own"), receiver.url("/global")]),
            bare.id: [receiver.url("/global")],
        }
    else:
        assert loaded == [own.id] and urls == {own.id: [receiver.url("/own")], bare.id: []}


def test_one_delivery_per_url_and_events_match_their_target(settings, db, receiver):
    settings = settings.model_copy(update={"webhook_url": receiver.url("/same")})
    with db.sessions.begin() as session:
        job = Job(model="tiny", prompt_token_ids=[1], params={}, webhook_url=receiver.url("/same"))
        session.add(job)
        session.flush()
        assert len(record_event(session, settings, "job.failed", job=job)) == 1
        with pytest.raises(ValueError, match="needs a job"):
            record_event(session, settings, "batch.completed", job=job)
        with pytest.raises(ValueError, match="needs a job"):
            record_event(session, settings, "job.exploded", job=job)


def test_the_jobs_of_a_batch_are_announced_by_the_batch_alone(settings, db, receiver):
    settings = settings.model_copy(update={"webhook_url": receiver.url("/global")})
    with db.sessions.begin() as session:
        file = File(purpose="batch", filename="in.jsonl", bytes=0, content=b"")
        session.add(file)
        session.flush()
        batch = Batch(
            status="in_progress",
            endpoint="/v1/completions",
            input_file_id=file.id,
            completion_window="24h",
            total=1,
        )
        session.add(batch)
        session.flush()
        job = Job(model="tiny", prompt_token_ids=[1], params={}, batch_id=batch.id, custom_id="a")
        session.add(job)
        session.flush()
        assert record_event(session, settings, "job.succeeded", job=job) == []
        assert len(record_event(session, settings, "batch.completed", batch=batch)) == 1


def test_pagedq_up_sends_webhooks_signed_with_a_secret_it_generates(tiny_llama, tmp_path, receiver):
    from tests.pagedq.test_embedded import embedded_settings, start_up

    settings = embedded_settings(tiny_llama, tmp_path).model_copy(
        update={"webhook_url": receiver.url("/up"), "webhook_allow_private": True}
    )
    process, client = start_up(settings, tmp_path / "up.log")
    try:
        job = client.post(
            "/v1/jobs", json={"prompt": "hi", "max_tokens": 4}, headers={"Prefer": "wait=60"}
        ).json()
        [request] = receiver.wait("/up", 1, process, timeout=60)
    finally:
        client.close()
        process.stop()
    secret = (settings.data_dir / "webhook_secret").read_text().strip()
    assert stat.S_IMODE(os.stat(settings.data_dir / "webhook_secret").st_mode) == 0o600
    payload = standardwebhooks.Webhook(secret).verify(request.body, request.headers)
    assert payload["type"] == "job.succeeded" and payload["data"]["id"] == job["id"]


# --- units ---


def test_the_signature_is_standard_webhooks():
    body = json.dumps(
        {"type": "job.succeeded", "data": {"id": "job_1", "output": "héllo"}}, ensure_ascii=False
    )
    timestamp = 1_700_000_000
    expected = standardwebhooks.Webhook(SECRET).sign("msg_1", datetime.fromtimestamp(timestamp, UTC), body)
    assert sign(SECRET, "msg_1", timestamp, body) == expected
    assert sign(SECRET, "msg_2", timestamp, body) != expected


def test_a_secret_is_generated_once_private_to_its_owner(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    secret = load_secret(settings)
    assert secret.startswith("whsec_") and len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
    assert load_secret(settings) == secret
    assert stat.S_IMODE(os.stat(tmp_path / "data" / "webhook_secret").st_mode) == 0o600
    assert load_secret(Settings(data_dir=tmp_path, webhook_secret=SECRET)) == SECRET
    with pytest.raises(ValueError, match="whsec_"):
        load_secret(Settings(data_dir=tmp_path, webhook_secret="hunter2"))


def test_retry_after_in_seconds_or_as_an_http_date():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("7", now) == 7.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0
    assert retry_after_seconds("soon", now) is None and retry_after_seconds(None, now) is None


def test_what_follows_each_kind_of_answer():
    settings = Settings(webhook_max_attempts=3, webhook_backoff_base=1.0)
    now = utcnow()

    def step(number: int = 1, **attempt: Any) -> tuple[str, float | None]:
        return next_step(Attempt(now, **attempt), number, settings)

    assert step(status_code=204) == ("delivered", None)
    assert step(status_code=410) == step(status_code=404) == step(status_code=302) == ("failed", None)
    assert step(error="refused: private") == ("failed", None)
    assert step(status_code=429, retry_after=7.0) == ("pending", 7.0)
    status, delay = step(2, status_code=503)
    assert status == "pending" and delay is not None and 1.5 <= delay <= 2.0
    assert step(1, error="ConnectTimeout", transient=True)[0] == "pending"
    assert step(3, status_code=500) == ("failed", None)  # the last attempt


def test_backoff_doubles_with_jitter_up_to_a_cap():
    assert [round(backoff(n, 1.0) / 2 ** (n - 1), 2) >= 0.75 for n in (1, 2, 3)] == [True] * 3
    assert all(backoff(n, 1.0) <= 2 ** (n - 1) for n in range(1, 8))
    assert backoff(40, 1.0) <= 3600.0


def first_and_last(special: SpecialRange) -> list[Address]:
    return [special.network[0], special.network[-1]]


@pytest.mark.parametrize("special", IPV4_SPECIAL + IPV6_SPECIAL, ids=str)
def test_every_special_purpose_address_is_refused_unless_private_ones_are_allowed(special):
    for address in first_and_last(special):
        host = f"[{address}]" if address.version == 6 else str(address)
        with pytest.raises(WebhookRefused, match="special-purpose range") as refused:
            checked_address(f"https://{host}/hook", allow_private=False, resolve_timeout=1)
        assert "PAGEDQ_WEBHOOK_ALLOW_PRIVATE" in str(refused.value)
        assert checked_address(f"https://{host}/hook", allow_private=True, resolve_timeout=1) == address


@pytest.mark.parametrize("special", IPV4_SPECIAL, ids=str)
def test_ipv4_special_addresses_are_refused_in_their_ipv6_forms(special):
    for address in first_and_last(special):
        mapped = IPv6Address(f"::ffff:{address}")
        nat64 = IPv6Address(int(IPv6Address("64:ff9b::")) | int(address))
        six_to_four = IPv6Address((0x2002 << 112) | (int(address) << 80))
        for form in (mapped, nat64, six_to_four):
            assert special_range(form) is not None, form
            with pytest.raises(WebhookRefused):
                checked_address(f"http://[{form}]/", allow_private=False, resolve_timeout=1)
        assert special_range(mapped) == special_range(nat64) == special_range(address)


def test_carrier_grade_nat_and_cloud_metadata_addresses_are_refused():
    for host in ("100.100.100.200", "100.64.0.1", "[::ffff:100.100.100.200]", "[fd00:ec2::254]"):
        with pytest.raises(WebhookRefused, match=r"Shared Address Space|Unique-Local"):
            checked_address(f"http://{host}/latest/meta-data", allow_private=False, resolve_timeout=1)


@pytest.mark.parametrize(
    "host", ["93.184.215.14", "[::ffff:93.184.215.14]", "[64:ff9b::5db8:d70e]", "[2606:4700::1]"]
)
def test_public_addresses_and_their_ipv6_forms_are_accepted(host):
    address = checked_address(f"https://{host}/hook", allow_private=False, resolve_timeout=1)
    assert special_range(address) is None and address == ip_address(host.strip("[]"))


def test_urls_that_are_not_http_or_do_not_resolve_are_refused():
    for url in ("file:///etc/passwd", "ftp://example.com/x", "http://", "https://:443/"):
        with pytest.raises(WebhookRefused, match="http"):
            checked_address(url, allow_private=True, resolve_timeout=1)
    for url in ("http://no-such-host.invalid/", "http:///no-such-host.invalid"):  # WHATWG: the same host
        with pytest.raises(OSError):
            checked_address(url, allow_private=True, resolve_timeout=1)


@pytest.mark.parametrize("url", ["http://10.0.0.1:80\\@8.8.8.8/", "http://127.0.0.1\\@example.com/"])
def test_the_guard_reads_the_host_the_sender_reaches(url):
    """urllib and httpx read the host after the backslash's "@"; WHATWG (the API's parser) reads the one
    before it, which is where the request would go: one parser everywhere, so the private host is seen."""
    with pytest.raises(WebhookRefused, match="special-purpose range"):
        checked_address(url, allow_private=False, resolve_timeout=1)
    assert parse_webhook_url(url).host in ("10.0.0.1", "127.0.0.1")


def test_a_slow_dns_answer_is_given_up_on_within_the_timeout(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: time.sleep(3) or [])
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no answer within 0\.2 s"):
        checked_address("https://slow.example/hook", allow_private=False, resolve_timeout=0.2)
    assert time.monotonic() - start < 1.5
