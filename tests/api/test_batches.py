"""OpenAI's Files and Batch APIs through the official ``openai`` SDK, against a real API server (uvicorn,
real HTTP), a real ``pagedq worker``, PostgreSQL and Redis."""

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from fastapi.testclient import TestClient
from openai.types import Batch, Completion
from openai.types.chat import ChatCompletion
from sqlalchemy import func, select, update

from api.app import create_app
from api.batches.lines import to_spec
from core.db import make_db_engine, make_sessionmaker
from core.models import Batch as BatchRow
from core.models import File, Job, WebhookDelivery, utcnow
from core.queue import make_celery, queue_name
from core.settings import Settings
from core.webhooks import Outbox
from migrations import upgrade
from pagedq import cli
from tests.support.jobs_client import Database, api_over_http, start_worker
from tests.support.services import Process, wait_for
from worker.batches import BatchKeeper

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HOOK = "https://93.184.215.14/batches"  # a public address: accepted with no DNS lookup, recorded, never sent


@pytest.fixture
def settings(service_settings: Settings) -> Iterator[Settings]:
    """The test's service, with webhook deliveries on a queue of its own; both queues dropped at the end
    (Redis db 13 outlives the test, and no worker ran some of the jobs). Lines run in input order (no
    prefix-aware order: a worker holding line 1's prefix would take lines 10-19 before line 2), as the
    partial-result tests count on the first lines ending first."""
    queue = f"pagedq.webhooks.{uuid.uuid4().hex[:8]}"
    settings = service_settings.model_copy(update={"webhook_queue": queue, "prefix_aware_order": False})
    yield settings
    broker = redis.Redis.from_url(settings.broker_url)
    for queue in (queue_name(settings.served_model_name), settings.webhook_queue):
        if keys := [*broker.scan_iter(f"{queue}*"), *broker.scan_iter(f"_kombu.binding*.{queue}")]:
            broker.delete(*keys)


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings)
    yield database
    database.close()


@pytest.fixture
def api_url(settings: Settings) -> Iterator[str]:
    with api_over_http(settings) as url:
        yield url


@pytest.fixture
def client(api_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{api_url}/v1", api_key="anything", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def worker(settings: Settings, db: Database, tmp_path: Path) -> Iterator[Process]:
    process = start_worker(settings, db, tmp_path / "worker.log")
    yield process
    process.stop()


def deliveries(db: Database, batch_id: str) -> list[str]:
    """The webhook events recorded for a batch."""
    with db.sessions() as session:
        query = select(WebhookDelivery.event_type).where(WebhookDelivery.batch_id == batch_id)
        return list(session.scalars(query))


def request_line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat(i: int, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"The quick brown fox {i} jumps over"}]
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True} | extra


def jsonl(lines: list[Any]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, lines: list[Any]) -> str:
    return client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch").id


def start_batch(client: openai.OpenAI, lines: list[Any], endpoint: str = CHAT, **extra: Any) -> Batch:
    return client.batches.create(
        input_file_id=upload(client, lines), endpoint=endpoint, completion_window="24h", **extra
    )


def wait_status(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 120) -> Batch:
    def reached() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in statuses else None

    return wait_for(reached, timeout, f"batch {batch_id} to reach {statuses}", interval=0.2)  # type: ignore[return-value]


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def batch_jobs(api_url: str, batch_id: str) -> dict[str, dict[str, Any]]:
    """The batch's jobs through ``GET /v1/jobs?batch_id=``, by custom_id."""
    page = httpx.get(f"{api_url}/v1/jobs", params={"batch_id": batch_id, "limit": 1000}).json()
    return {job["custom_id"]: job for job in page["data"]}


def test_chat_batch_round_trip_through_the_openai_sdk(client, api_url, worker, settings, db):
    ids = [f"req-{i * 7 % 12}" for i in range(12)]  # not in sorted order: the output keeps input order
    bodies = [chat(i, max_tokens=4 + i) for i in range(12)]
    bodies[1] = chat(1, max_tokens=None, max_completion_tokens=5)
    bodies[2]["messages"] = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "The quick "}, {"type": "text", "text": "fox"}],
        },
    ]
    bodies[3] |= {"model": Path(settings.model).name, "stop": "NEVER-SAID", "n": 1, "user": "ann"}
    uploaded = client.files.create(
        file=("input.jsonl", jsonl([request_line(c, b) for c, b in zip(ids, bodies, strict=True)])),
        purpose="batch",
    )
    assert uploaded.id.startswith("file-") and uploaded.purpose == "batch" and uploaded.status == "processed"
    assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes > 0

    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"project": "round-trip"},
        extra_body={"priority": 5, "webhook_url": HOOK, "webhook_events": ["batch.completed"]},
    )
    assert created.status == "in_progress" and created.request_counts.total == 12
    assert created.metadata == {"project": "round-trip"} and created.expires_at == created.created_at + 86400
    done = wait_status(client, created.id, {"completed"})

    assert done.request_counts.completed == 12 and done.request_counts.failed == 0
    assert done.error_file_id is None and done.completed_at >= done.finalizing_at >= done.in_progress_at
    lines = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in lines] == ids
    jobs = batch_jobs(api_url, created.id)
    assert len(jobs) == 12 and all(job["priority"] == 5 for job in jobs.values())
    for line, body in zip(lines, bodies, strict=True):
        job = httpx.get(f"{api_url}/v1/jobs/{line['response']['request_id']}").json()
        assert job == jobs[line["custom_id"]]
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["request_id"] == job["id"] and job["batch_id"] == created.id
        assert completion.choices[0].message.content == job["output"] != ""
        expected_tokens = body.get("max_tokens") or body["max_completion_tokens"]
        assert completion.usage.completion_tokens == expected_tokens == job["usage"]["completion_tokens"]
        assert completion.usage.prompt_tokens == job["usage"]["prompt_tokens"] > 0
        assert len(line["timings"]["token_times_ms"]) == expected_tokens
    assert done.usage.output_tokens == sum(job["usage"]["completion_tokens"] for job in jobs.values())
    assert deliveries(db, created.id) == ["batch.completed"]

    # A line is tokenized exactly as the same request sent alone to POST /v1/jobs.
    alone = httpx.post(f"{api_url}/v1/jobs", json={"messages": bodies[0]["messages"], "max_tokens": 1}).json()
    assert alone["usage"]["prompt_tokens"] == jobs[ids[0]]["usage"]["prompt_tokens"]


def test_a_batch_is_finalized_as_its_last_job_ends_not_a_reconcile_round_later(
    client, settings, db, tmp_path
):
    rare_rounds = settings.model_copy(update={"reconcile_interval": 600.0})  # no round within the test
    worker = start_worker(rare_rounds, db, tmp_path / "worker.log")
    try:
        batch = start_batch(client, [request_line(f"r{i}", chat(i)) for i in range(3)])
        completed = wait_status(client, batch.id, {"completed", "failed"}, timeout=60)
    finally:
        worker.stop()
    assert completed.status == "completed" and completed.request_counts.completed == 3
    assert completed.output_file_id is not None


def test_completions_batch_returns_text_completions_equal_to_the_jobs(client, api_url, worker):
    prompts = [f"The quick brown fox {i} jumps over" for i in range(6)]
    lines = [
        request_line(
            f"c{i}", {"prompt": [p], "max_tokens": 6, "temperature": 0, "ignore_eos": True}, COMPLETIONS
        )
        for i, p in enumerate(prompts)
    ]
    batch = wait_status(client, start_batch(client, lines, COMPLETIONS).id, {"completed"})
    jobs = batch_jobs(api_url, batch.id)
    output = file_lines(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] == [f"c{i}" for i in range(6)]
    for line in output:
        completion = Completion.model_validate(line["response"]["body"])
        assert completion.object == "text_completion" and completion.choices[0].finish_reason == "length"
        assert completion.choices[0].text == jobs[line["custom_id"]]["output"]
        assert completion.usage.completion_tokens == 6


LONG_BATCH = [request_line(f"r{i}", chat(i, max_tokens=8 if i < 4 else 400)) for i in range(120)]


def start_long_batch(client: openai.OpenAI) -> Batch:
    """120 lines, four short ones first; returns once those four have finished."""
    batch = start_batch(client, LONG_BATCH)
    done = lambda: client.batches.retrieve(batch.id).request_counts.completed >= 4  # noqa: E731
    wait_for(done, 120, "the short lines to finish")
    return batch


def check_partial_results(client: openai.OpenAI, api_url: str, batch: Batch, code: str) -> None:
    """Succeeded lines in the output file, the others in the error file with ``code``: each line once, in
    input order, as the jobs say; the counts add up."""
    counts = batch.request_counts
    assert counts.total == 120 and counts.completed + counts.failed == 120 and 4 <= counts.completed < 120
    output, errors = file_lines(client, batch.output_file_id), file_lines(client, batch.error_file_id)
    jobs = batch_jobs(api_url, batch.id)
    order = [line["custom_id"] for line in LONG_BATCH]
    assert [line["custom_id"] for line in output] == [c for c in order if jobs[c]["status"] == "succeeded"]
    assert [line["custom_id"] for line in errors] == [c for c in order if jobs[c]["status"] == "cancelled"]
    assert len(output) == counts.completed and len(errors) == counts.failed
    assert {"r0", "r1", "r2", "r3"} <= {line["custom_id"] for line in output}
    assert {line["error"]["code"] for line in errors} == {code}
    assert all(line["response"] is None for line in errors)


def test_cancel_mid_batch_keeps_finished_results_and_cancels_the_rest(client, api_url, worker, db):
    batch = start_long_batch(client)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    ended = wait_status(client, batch.id, {"cancelled"})

    assert ended.cancelled_at >= ended.finalizing_at >= ended.cancelling_at and ended.completed_at is None
    check_partial_results(client, api_url, ended, "batch_cancelled")
    with pytest.raises(openai.ConflictError, match="already cancelled"):
        client.batches.cancel(batch.id)


def test_expired_batch_keeps_finished_results(client, api_url, worker, db):
    batch = start_long_batch(client)
    with db.sessions.begin() as session:  # the 24h window, run out
        session.execute(update(BatchRow).where(BatchRow.id == batch.id).values(expires_at=utcnow()))
    ended = wait_status(client, batch.id, {"expired"})

    assert ended.expired_at is not None and ended.cancelled_at is None and ended.cancelling_at is None
    check_partial_results(client, api_url, ended, "batch_expired")


def test_a_malformed_file_fails_the_batch_with_every_bad_line_and_creates_no_job(client, api_url, db):
    too_long = " ".join(["fox"] * 2000)
    lines = [
        request_line("a", chat(0)),
        "{not json",
        {"method": "POST", "url": CHAT, "body": chat(2)},
        request_line("a", chat(3)),
        request_line("d", chat(4), url=COMPLETIONS),
        request_line("e", chat(5, foo=1)),
        request_line("f", chat(6) | {"messages": [{"role": "user", "content": too_long}]}),
        request_line("g", chat(7, model="gpt-4o")),
        request_line("h", chat(8, logprobs=True)),
        "",
        request_line("i", chat(10, temperature=-1)),
        request_line("j", chat(11)),
    ]
    batch = start_batch(client, lines, extra_body={"webhook_url": HOOK})

    assert batch.status == "failed" and batch.failed_at is not None and batch.in_progress_at is None
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [
        (2, "invalid_json_line", None),
        (3, "missing_required_parameter", "custom_id"),
        (4, "duplicate_custom_id", None),
        (5, "invalid_url", "url"),
        (6, "unknown_parameter", "body.foo"),
        (7, "context_length_exceeded", "body.messages"),
        (8, "model_not_found", "body.model"),
        (9, "unsupported_parameter", "body.logprobs"),
        (11, "invalid_value", "body.temperature"),
    ]
    assert "already used on line 1" in batch.errors.data[2].message
    assert "exceeds the model's context of 1024 tokens" in batch.errors.data[5].message
    assert batch.request_counts.total == 0 and batch.output_file_id is None
    with db.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0
    assert client.batches.retrieve(batch.id).status == "failed"
    assert deliveries(db, batch.id) == ["batch.failed"]


def test_a_line_without_max_tokens_may_fill_the_context_and_cancelling_a_queued_batch_is_immediate(
    client, api_url
):
    batch = start_batch(client, [request_line("only", {"messages": [{"role": "user", "content": "Hi"}]})])
    [job] = batch_jobs(api_url, batch.id).values()
    assert job["params"]["max_tokens"] == 1024 - job["usage"]["prompt_tokens"]
    assert job["status"] == "queued" and job["custom_id"] == "only"

    cancelled = client.batches.cancel(batch.id)  # no worker: the job is queued, so it is cancelled at once
    assert cancelled.status == "cancelling" and cancelled.request_counts.failed == 1
    assert batch_jobs(api_url, batch.id)["only"]["status"] == "cancelled"


def test_a_batch_is_answered_first_and_its_jobs_published_after(client, settings):
    broker = redis.Redis.from_url(settings.broker_url)
    queue = queue_name(settings.served_model_name)
    batch = start_batch(client, [request_line(f"r{i}", chat(i)) for i in range(300)])
    assert batch.status == "in_progress" and batch.request_counts.total == 300

    def published() -> bool:
        return sum(broker.llen(key) for key in broker.scan_iter(f"{queue}*")) == 300

    wait_for(published, 30, "the background publisher to send 300 messages")


def test_batch_requests_are_refused_with_clear_errors(client):
    file_id = upload(client, [request_line("a", chat(0))])
    with pytest.raises(openai.UnprocessableEntityError, match="completion_window"):
        client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="1d")
    with pytest.raises(openai.UnprocessableEntityError, match="endpoint"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/responses", completion_window="24h")
    with pytest.raises(openai.NotFoundError, match="file-nope"):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError, match="batch_nope"):
        client.batches.retrieve("batch_nope")
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="2h")
    assert batch.expires_at - batch.created_at == 7200


def test_files_upload_read_download_and_delete(client):
    data = jsonl([request_line("a", chat(0))])
    file = client.files.create(file=("mine.jsonl", data), purpose="batch")
    assert (file.filename, file.bytes) == ("mine.jsonl", len(data))
    assert client.files.content(file.id).content == data
    batch = client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.ConflictError, match=batch.id):
        client.files.delete(file.id)

    loose = client.files.create(file=("loose.jsonl", data), purpose="batch")
    assert client.files.delete(loose.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(loose.id)
    with pytest.raises(openai.UnprocessableEntityError, match="purpose"):
        client.files.create(file=("x.jsonl", data), purpose="fine-tune")


def test_batches_list_newest_first_a_page_at_a_time(client, api_url):
    file_id = upload(client, [request_line("a", chat(0))])
    made = [
        client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h").id
        for _ in range(5)
    ]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more is True
    assert [b.id for b in client.batches.list(limit=2)] == made[::-1]  # the SDK follows the pages
    raw = httpx.get(f"{api_url}/v1/batches", params={"limit": 2, "after": made[1]}).json()
    assert raw["object"] == "list" and [b["id"] for b in raw["data"]] == [made[0]]
    assert raw["first_id"] == raw["last_id"] == made[0] and raw["has_more"] is False


def test_pagedq_submit_batch_writes_every_line_in_input_order(api_url, worker, tmp_path, capsys):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl([request_line(f"q{i}", chat(i, max_tokens=3)) for i in range(5)]))
    out = tmp_path / "results.jsonl"
    assert cli.main(["submit", str(path), "--batch", "--out", str(out), "--url", api_url]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == [f"q{i}" for i in range(5)]
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 3 for r in results)
    assert "completed: 5 completed, 0 failed" in capsys.readouterr().err


def test_pagedq_submit_batch_reports_the_bad_lines_of_a_refused_file(api_url, tmp_path, capsys):
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl([request_line("q", chat(0)), request_line("q", chat(1)), "[]"]))
    assert cli.main(["submit", str(path), "--batch", "--url", api_url]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{path}:2: duplicate_custom_id: custom_id 'q' is already used on line 1",
        f"{path}:3: invalid_json_line: expected a JSON object, got list",
    ]


def test_workers_finalizing_a_batch_at_once_write_one_output_and_one_event(client, db, settings):
    batch = start_batch(client, [request_line(f"r{i}", chat(i)) for i in range(3)])
    with db.sessions.begin() as session:  # as if a worker had run them
        done = {"status": "succeeded", "output_text": "ok", "finish_reason": "stop"}
        session.execute(update(Job).where(Job.batch_id == batch.id).values(done))
    everything = settings.model_copy(update={"webhook_url": HOOK})  # a global endpoint: every event
    keepers = [BatchKeeper(db.sessions, Outbox(everything, make_celery(everything))) for _ in range(4)]
    threads = [threading.Thread(target=keeper.keep) for keeper in keepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    completed = client.batches.retrieve(batch.id)
    assert completed.status == "completed" and completed.request_counts.completed == 3
    with db.sessions() as session:
        outputs = session.scalars(select(File.id).where(File.purpose == "batch_output")).all()
    assert outputs == [completed.output_file_id]
    texts = [
        line["response"]["body"]["choices"][0]["message"]["content"]
        for line in file_lines(client, outputs[0])
    ]
    assert texts == ["ok"] * 3
    assert deliveries(db, batch.id) == ["batch.completed"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (chat(0, max_tokens=None, max_completion_tokens=7), {"max_tokens": 7}),
        (chat(0, stop="END"), {"stop": ["END"]}),
        (
            chat(0, top_k=5, min_p=0.1, repetition_penalty=1.2),
            {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2},
        ),
        (chat(0, logprobs=False, top_logprobs=0, stream=False, user="u"), {"temperature": 0.0}),
    ],
)
def test_openai_bodies_map_onto_the_engine_sampling_fields(body, expected):
    spec, fills = to_spec({k: v for k, v in body.items() if v is not None}, CHAT, None)
    assert not fills and spec.engine_params().items() >= expected.items()


def test_openai_message_forms_become_plain_chat_messages():
    body = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]
    }
    spec, fills = to_spec(body, CHAT, None)
    assert fills and [m.model_dump() for m in spec.messages] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]


def test_a_batch_runs_its_course_on_sqlite_the_embedded_mode(tiny_llama: Path, tmp_path: Path):
    settings = Settings(data_dir=tmp_path / "data", model=str(tiny_llama), max_model_len=256)
    upgrade(settings)
    lines = [request_line(f"r{i}", {"prompt": f"fox {i}", "max_tokens": 4}, COMPLETIONS) for i in range(3)]
    with TestClient(create_app(settings)) as http:
        file = http.post("/v1/files", files={"file": ("in.jsonl", jsonl(lines))}, data={"purpose": "batch"})
        body = {"input_file_id": file.json()["id"], "endpoint": COMPLETIONS, "completion_window": "24h"}
        batch = http.post("/v1/batches", json=body).json()
        assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 3
        sessions = make_sessionmaker(make_db_engine(settings))
        with sessions.begin() as session:  # as if a worker had run them
            session.execute(update(Job).values(status="succeeded", output_text="ok", completion_tokens=4))
        BatchKeeper(sessions, Outbox(settings, make_celery(settings))).keep()
        done = http.get(f"/v1/batches/{batch['id']}").json()
        output = http.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == 12
    assert [json.loads(line)["custom_id"] for line in output] == ["r0", "r1", "r2"]
