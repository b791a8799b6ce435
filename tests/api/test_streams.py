"""``GET /v1/jobs/{id}/events``: live text as the worker produces it, then the finished job."""

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from core.settings import Settings
from core.streams import stream_key
from migrations import upgrade
from tests.support.jobs_client import Database, api_client, start_worker, submit
from tests.support.services import Process, wait_for
from tests.support.tiny_models import make_tiny_model

PROMPT = "The quick brown fox jumps over"


def read_events(client: TestClient, job_id: str) -> list[tuple[str, Any]]:
    events, name = [], None
    with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def streamed_text(events: list[tuple[str, Any]]) -> str:
    return "".join(data["text"] for name, data in events if name == "delta")


@pytest.fixture
def running_worker(service_settings: Settings, tmp_path: Path) -> Iterator[Process]:
    db = Database(service_settings)
    worker = start_worker(service_settings, db, tmp_path / "worker.log")
    yield worker
    worker.stop()
    db.close()


def test_stream_delivers_the_text_as_it_is_produced_then_the_job(service_settings, running_worker) -> None:
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPT, max_tokens=300, temperature=0, ignore_eos=True)
        events = read_events(client, job_id)
        final = client.get(f"/v1/jobs/{job_id}").json()
    deltas = [data for name, data in events if name == "delta"]
    assert len(deltas) > 5, "text should arrive in many pieces, not at the end"
    assert events[-1][0] == "job" and events[-1][1]["status"] == "succeeded"
    assert streamed_text(events) == final["output"] == events[-1][1]["output"]


def test_a_late_client_first_gets_everything_produced_so_far(service_settings, running_worker) -> None:
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
        first = read_events(client, job_id)  # follows it live, to the end
        late = read_events(client, job_id)  # connects after the job finished
    assert streamed_text(late) == streamed_text(first) == late[-1][1]["output"]
    assert late[-1][1]["usage"]["completion_tokens"] == 40


def test_a_queued_job_cancelled_before_it_ran_ends_its_stream(service_settings: Settings) -> None:
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPT, max_tokens=8)
        cancel = threading.Timer(0.3, lambda: client.post(f"/v1/jobs/{job_id}/cancel"))
        cancel.start()
        events = read_events(client, job_id)
    assert events == [("job", events[-1][1])] and events[-1][1]["status"] == "cancelled"


def test_unknown_job_is_a_404(service_settings: Settings) -> None:
    with api_client(service_settings) as client:
        response = client.get("/v1/jobs/job_nope/events")
    assert response.status_code == 404 and "job_nope" in response.text


def test_embedded_mode_streams_from_the_job_row(tmp_path: Path) -> None:
    """The reader polls the row from the job's queued state, and sees the run's output as the worker
    flushes it, before its end. A model whose 600-token run lasts several flush intervals: the default tiny
    model's ran in ~0.2 s on a fast machine, with no partial write before its end (its steps are Python)."""
    model = make_tiny_model(
        tmp_path / "model", "llama", hidden_size=256, intermediate_size=1024, num_hidden_layers=4
    )
    settings = Settings(
        data_dir=tmp_path / "data",
        model=str(model),
        device="cpu",
        kv_cache_bytes=64 * 2**20,
        flush_interval=0.05,
    )
    upgrade(settings)
    db = Database(settings)
    worker = start_worker(settings, db, tmp_path / "worker.log")
    try:
        with api_client(settings) as client:
            job_id = submit(client, prompt=PROMPT, max_tokens=600, temperature=0, ignore_eos=True)
            events = read_events(client, job_id)
    finally:
        worker.stop()
        db.close()
    assert events[0][0] == "delta", events[0]  # read from its queued row: its first run is no restart
    assert len([name for name, _ in events if name == "delta"]) > 1
    assert events[-1][0] == "job" and streamed_text(events) == events[-1][1]["output"]


def test_a_job_nobody_reads_is_not_streamed(service_settings: Settings, running_worker: Process) -> None:
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
        wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded", 60, "the job")
    assert not redis.Redis.from_url(service_settings.resolved_broker_url).exists(stream_key(job_id))


def test_a_reader_who_comes_mid_run_gets_everything_so_far_then_the_rest(
    service_settings: Settings, running_worker: Process
) -> None:
    with api_client(service_settings) as client:
        job_id = submit(client, prompt=PROMPT, max_tokens=600, temperature=0, ignore_eos=True)
        polled = wait_for(lambda: client.get(f"/v1/jobs/{job_id}").json()["output"], 60, "a first flush")
        events = read_events(client, job_id)
    final = events[-1][1]
    assert final["status"] == "succeeded" and final["usage"]["completion_tokens"] == 600
    assert streamed_text(events) == final["output"] and final["output"].startswith(polled)
    assert redis.Redis.from_url(service_settings.resolved_broker_url).exists(stream_key(job_id))
