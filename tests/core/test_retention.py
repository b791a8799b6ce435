"""Retention: what has expired answers 404 at once and is purged in small transactions, and nothing that
still runs is touched; DELETE of jobs, batches and files. Real API over HTTP, PostgreSQL and Redis (and a
real worker for the batch's whole course); clocks are set by writing times in the past, never by sleeping."""

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from sqlalchemy import func, select, update

from core.models import Batch, File, Job, TokenTimes, WebhookDelivery, utcnow
from core.purge import Purger
from core.queue import make_celery, queue_name
from core.settings import Settings
from core.streams import stream_dropper, stream_key
from core.webhooks import Outbox
from tests.api import test_batches
from tests.support.jobs_client import Database, start_worker
from tests.support.services import wait_for
from worker.batches import BatchKeeper

CHAT = "/v1/chat/completions"
HOUR, DAY = 3600, 86400


@pytest.fixture
def settings(service_settings: Settings) -> Iterator[Settings]:
    yield service_settings
    queue = queue_name(service_settings.served_model_name)
    broker = redis.Redis.from_url(service_settings.broker_url)
    if keys := [*broker.scan_iter(f"{queue}*"), *broker.scan_iter(f"_kombu.binding*.{queue}")]:
        broker.delete(*keys)


db, api_url = test_batches.db, test_batches.api_url  # fixtures, run on this module's settings


@pytest.fixture
def api(api_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_url) as http:
        yield http


@pytest.fixture
def sdk(api_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def submit(api: httpx.Client) -> str:
    response = api.post("/v1/jobs", json={"prompt": "The quick brown fox", "max_tokens": 4})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def jsonl(n: int) -> bytes:
    body = {"messages": [{"role": "user", "content": "fox"}], "max_tokens": 2, "ignore_eos": True}
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": body} for i in range(n)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(sdk: openai.OpenAI, lines: int = 2, **extra: Any) -> str:
    return sdk.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch", **extra).id


def start_batch(sdk: openai.OpenAI, file_id: str, **extra: Any) -> str:
    return sdk.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h", **extra).id


def set_rows(db: Database, table: Any, ids: list[str], **values: Any) -> None:
    with db.sessions.begin() as session:
        session.execute(update(table).where(table.id.in_(ids)).values(**values))


def ids_of(db: Database, table: Any) -> set[str]:
    with db.sessions() as session:
        return set(session.scalars(select(table.id)))


def end_batch(db: Database, settings: Settings, batch_id: str) -> None:
    """As if a worker had run its jobs: a keeper finalizes it (output file, ``retained_until``)."""
    with db.sessions.begin() as session:
        session.execute(
            update(Job).where(Job.batch_id == batch_id).values(status="succeeded", output_text="ok")
        )
    BatchKeeper(db.sessions, Outbox(settings, make_celery(settings))).keep()


def test_expired_objects_answer_404_then_the_purge_deletes_exactly_them(api, sdk, db, settings):
    past = utcnow() - timedelta(seconds=1)
    due, kept, queued, running = (submit(api) for _ in range(4))
    set_rows(db, Job, [due, kept, running], status="succeeded", finished_at=past)
    set_rows(db, Job, [running], status="running")
    set_rows(db, Job, [due, queued, running], expires_at=past)  # the queued and running ones still run
    with db.sessions.begin() as session:  # what goes with a job: token times, deliveries, its stream
        session.add(TokenTimes(job_id=due, attempt=0, first=0, times_ms=[1.0, 2.0]))
        session.add(
            WebhookDelivery(event_type="job.succeeded", url="https://x.test/", payload={}, job_id=due)
        )
    streams = redis.Redis.from_url(settings.broker_url)
    streams.xadd(stream_key(due), {"text": "a"})

    expired_file, kept_file = (
        upload(sdk, expires_after={"anchor": "created_at", "seconds": HOUR}),
        upload(sdk),
    )
    running_batch = start_batch(sdk, upload(sdk))
    ended_batch = start_batch(sdk, shared_input := upload(sdk))
    end_batch(db, settings, ended_batch)
    output = sdk.batches.retrieve(ended_batch).output_file_id
    set_rows(db, Batch, [ended_batch], retained_until=past)
    set_rows(db, File, [output], expires_at=past)  # a batch's output expires with it
    set_rows(db, File, [expired_file, shared_input], expires_at=past)  # the latter: its batch holds it

    for path in (f"/v1/jobs/{due}", f"/v1/files/{expired_file}", f"/v1/files/{expired_file}/content",
                 f"/v1/files/{output}", f"/v1/batches/{ended_batch}", f"/v1/jobs/{due}/webhook-deliveries",
                 f"/v1/batches/{ended_batch}/webhook-deliveries"):  # fmt: skip
        assert api.get(path).status_code == 404, path
    assert api.post(f"/v1/jobs/{due}/cancel").status_code == 404
    assert api.get(f"/v1/jobs/{queued}").json()["status"] == "queued"
    assert api.get(f"/v1/jobs/{running}").json()["status"] == "running"
    listed = {job["id"] for job in api.get("/v1/jobs", params={"limit": 100}).json()["data"]}
    assert {due, kept, queued, running} & listed == {kept, queued, running}
    assert api.get("/v1/jobs", params={"batch_id": ended_batch}).json()["data"] == []
    assert [b.id for b in sdk.batches.list()] == [running_batch]
    assert sdk.files.retrieve(kept_file).expires_at == pytest.approx(
        (utcnow() + timedelta(days=30)).timestamp(), abs=60
    )

    jobs_before, files_before = ids_of(db, Job), ids_of(db, File)
    with db.sessions() as session:
        ended_jobs = set(session.scalars(select(Job.id).where(Job.batch_id == ended_batch)))
    counts = Purger(db.sessions, chunk=2, drop_streams=stream_dropper(settings)).purge()

    assert counts == {"jobs": 1, "batches": 1, "files": 2}  # the shared input went after its batch
    with db.sessions() as session:
        leftovers = [session.scalar(select(func.count()).select_from(t).where(t.job_id == due))
                     for t in (TokenTimes, WebhookDelivery)]  # fmt: skip
    assert ids_of(db, Job) == jobs_before - {due} - ended_jobs and len(ended_jobs) == 2
    assert ids_of(db, File) == files_before - {expired_file, shared_input, output}
    assert ids_of(db, Batch) == {running_batch}
    assert leftovers == [0, 0] and streams.exists(stream_key(due)) == 0


def test_delete_routes(api, sdk, db, settings):
    job = submit(api)
    conflict = api.delete(f"/v1/jobs/{job}")
    assert conflict.status_code == 409 and "cancel it first" in conflict.json()["detail"]
    api.post(f"/v1/jobs/{job}/cancel")
    assert api.delete(f"/v1/jobs/{job}").json() == {"id": job, "object": "job", "deleted": True}
    assert api.get(f"/v1/jobs/{job}").status_code == 404 and api.delete(f"/v1/jobs/{job}").status_code == 404
    assert job not in ids_of(db, Job)

    shared = upload(sdk)
    batch, other = start_batch(sdk, shared), start_batch(sdk, shared)
    line = api.get("/v1/jobs", params={"batch_id": batch}).json()["data"][0]["id"]
    running = api.delete(f"/v1/batches/{batch}")
    assert running.status_code == 409 and "cancel it first" in running.json()["error"]["message"]
    assert api.delete(f"/v1/jobs/{line}").status_code == 409  # a line goes with its batch
    end_batch(db, settings, batch)
    output = sdk.batches.retrieve(batch).output_file_id
    assert api.delete(f"/v1/batches/{batch}").json() == {"id": batch, "object": "batch", "deleted": True}
    assert api.get(f"/v1/batches/{batch}").status_code == 404
    assert api.get("/v1/jobs", params={"batch_id": batch}).json()["data"] == []
    assert batch not in ids_of(db, Batch) and output not in ids_of(db, File)
    assert sdk.files.retrieve(shared).id == shared  # the other batch still reads it

    end_batch(db, settings, other)
    api.delete(f"/v1/batches/{other}")
    assert shared not in ids_of(db, File)  # its last batch took it along
    lone = upload(sdk)
    assert sdk.files.delete(lone).deleted and api.get(f"/v1/files/{lone}").status_code == 404


def test_expiry_is_checked_at_submission(api, sdk):
    with pytest.raises(openai.UnprocessableEntityError, match="greater than or equal to 3600"):
        upload(sdk, expires_after={"anchor": "created_at", "seconds": 60})
    with pytest.raises(openai.UnprocessableEntityError, match="less than or equal to 2592000"):
        start_batch(sdk, upload(sdk), output_expires_after={"anchor": "created_at", "seconds": 31 * DAY})
    job = api.get(f"/v1/jobs/{submit(api)}").json()
    assert job["expires_at"] is not None


def test_a_worker_keeps_a_batch_for_its_output_expires_after_then_purges_it(
    sdk, db, settings, tmp_path: Path
):
    batch_id = start_batch(
        sdk, upload(sdk, lines=3), output_expires_after={"anchor": "created_at", "seconds": HOUR}
    )
    worker = start_worker(settings.model_copy(update={"purge_interval": 0.5}), db, tmp_path / "worker.log")
    try:
        done = wait_for(
            lambda: (b := sdk.batches.retrieve(batch_id)).status == "completed" and b,
            120,
            "the batch to complete",
        )
        output = sdk.files.retrieve(done.output_file_id)
        assert output.expires_at == pytest.approx(done.completed_at + HOUR, abs=2)
        assert all(job.status == "succeeded" for job in db.jobs(list(ids_of(db, Job))))
        set_rows(db, Batch, [batch_id], retained_until=utcnow() - timedelta(seconds=1))
        wait_for(lambda: batch_id not in ids_of(db, Batch), 30, "the worker's purge")
    finally:
        worker.stop()
    assert ids_of(db, Job) == set() and output.id not in ids_of(db, File)
