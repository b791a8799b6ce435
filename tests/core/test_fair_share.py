"""Fair share through a real worker: online before a batch, keys in turn, aging (worker/fair.py).

Jobs are submitted while no worker runs (auth off), then tagged with the owner key ids of two real keys
(``jobs.key_id``, which the API sets from the caller's key with auth on), then a two-seat worker starts on
the backlog. The order
the worker claimed them in is the order of ``started_at``.
"""

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from core import keys
from core.models import Job, utcnow
from tests.support.jobs_client import api_client, start_worker, submit
from tests.support.services import Process

SEATS = 2


@pytest.fixture
def workers() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for worker in started:
        worker.stop()


def owner(db, name: str) -> str:
    """A real key's id (jobs.key_id refers to api_keys)."""
    with db.sessions.begin() as session:
        row, _ = keys.create(session, f"{name}-{uuid.uuid4().hex[:8]}")
        session.flush()
        return row.id


def tag(db, job_ids: list[str], **values: object) -> None:
    with db.sessions.begin() as session:
        session.execute(update(Job).where(Job.id.in_(job_ids)).values(**values))


def run_all(settings, db, workers, tmp_path: Path, job_ids: list[str]) -> list[str]:
    """Start a two-seat worker on the backlog; returns the jobs in the order they started."""
    workers.append(start_worker(settings.model_copy(update={"max_num_seqs": SEATS}), db, tmp_path / "w.log"))
    jobs = db.wait_until(job_ids, {"succeeded"}, timeout=60)
    return [job.id for job in sorted(jobs, key=lambda job: job.started_at)]


def job(client, i: int, **body: object) -> str:
    return submit(client, prompt=f"The quick brown fox {i} jumps over", max_tokens=8, ignore_eos=True, **body)


def batch(client, size: int, window: str = "1h") -> tuple[str, int]:
    lines = [
        {
            "custom_id": f"l{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": f"Fox {i}", "max_tokens": 8},
        }
        for i in range(size)
    ]
    upload = client.post(
        "/v1/files",
        files={"file": ("in.jsonl", "".join(json.dumps(line) + "\n" for line in lines))},
        data={"purpose": "batch"},
    )
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/completions", "completion_window": window}
    created = client.post("/v1/batches", json=body).json()
    return created["id"], created["priority"]


def lines_of(db, batch_id: str) -> list[str]:
    with db.sessions() as session:
        return list(session.scalars(select(Job.id).where(Job.batch_id == batch_id).order_by(Job.id)))


def test_online_first_keys_in_turn_and_aging(service_settings, db, workers, tmp_path):
    """One backlog (one worker start): an old job of the worst priority, key A's batch, key B's jobs at
    the batch's priority, then one online job of a third key (NULL: the open mode)."""
    with api_client(service_settings) as client:
        aged = job(client, 0, priority=100)
        batch_id, priority = batch(client, 10)
        a = lines_of(db, batch_id)
        b = [job(client, i, priority=priority) for i in range(1, 9)]
        online = job(client, 9)
        fresh = job(client, 10, priority=100)
        tag(db, a, key_id=owner(db, "a"))
        tag(db, b, key_id=owner(db, "b"))
        # Two hours waited at the default aging of 30 s are 240 points: it ranks as priority -140.
        tag(db, [aged], queued_at=utcnow() - timedelta(hours=2))
        order = run_all(service_settings, db, workers, tmp_path, [aged, *a, *b, online, fresh])
    assert priority == service_settings.batch_priority > 0  # a batch defaults to after online requests
    names = {aged: "aged", online: "online", fresh: "fresh"} | dict.fromkeys(a, "A") | dict.fromkeys(b, "B")
    started = [names[job_id] for job_id in order]
    # Arrival order would run the online job after all 18 batch-priority jobs, and the aged one first only
    # because it came first; the fresh job of the same priority, not aged, runs last.
    assert set(started[:SEATS]) == {"aged", "online"} and started[-1] == "fresh", " ".join(started)
    # Arrival order would run A's ten before any of B's; sharing the seats, B takes every other free one.
    assert started[SEATS : SEATS + 8].count("B") >= 3, " ".join(started)


def test_earliest_deadline_first_among_equal_aged_priorities(service_settings, db, workers, tmp_path):
    """Key A's 24-hour batch, then its 1-hour batch, queued in one aging step; key B's jobs of the same
    priority and no deadline; an online job and an old, aged one of the worst priority."""
    with api_client(service_settings) as client:
        aged = job(client, 0, priority=100)
        late = lines_of(db, batch(client, 4, window="24h")[0])
        soon_id, priority = batch(client, 4, window="1h")
        soon = lines_of(db, soon_id)
        b = [job(client, i, priority=priority) for i in range(1, 7)]
        online = job(client, 9)
    step = service_settings.fair_aging_seconds
    start = (int(utcnow().timestamp() // step) - 2) * step  # one aging step, so equal aged priorities
    moment = datetime.fromtimestamp(start, UTC)
    tag(db, late, key_id=(a_key := owner(db, "a")), queued_at=moment)
    tag(db, soon, key_id=a_key, queued_at=moment + timedelta(seconds=1))  # after late: FIFO would run late
    tag(db, b, key_id=owner(db, "b"), queued_at=moment + timedelta(seconds=2))
    tag(db, [aged], queued_at=utcnow() - timedelta(hours=2))
    order = run_all(service_settings, db, workers, tmp_path, [aged, *late, *soon, *b, online])
    names = {aged: "aged", online: "online"} | dict.fromkeys(late, "late") | dict.fromkeys(soon, "soon")
    started = [names.get(job_id, "B") for job_id in order]
    assert set(started[:SEATS]) == {"aged", "online"}, " ".join(started)  # priority and aging first
    assert [n for n in started if n in ("soon", "late")] == ["soon"] * 4 + ["late"] * 4, " ".join(started)
    assert started[SEATS : SEATS + 8].count("B") >= 3, " ".join(started)  # B still shares the seats
