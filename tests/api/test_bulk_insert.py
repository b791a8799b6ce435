"""Jobs inserted in bulk read back exactly as given: COPY's text format on the real PostgreSQL (its
escapes are written by pagedq), executemany on SQLite."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from api.batches.bulk_insert import insert_jobs
from core.db import make_db_engine, make_sessionmaker
from core.models import Job, utcnow
from core.settings import Settings
from migrations import upgrade

# Every character COPY's text format escapes, the escapes themselves written out, and text that
# looks like them: each must arrive as written.
AWKWARD = [
    "tab\there",
    "new\nline",
    "carriage\rreturn",
    "back\\slash",
    "\\N",
    "\\t literally",
    'quote " and \\" in JSON',
    "émoji 🙂 and 中文",
    "",
]


def rows() -> list[dict[str, Any]]:
    return [
        {
            "id": f"job_bulk{i:04d}",
            "prompt": text if i % 2 else None,
            "messages": [{"role": "user", "content": text}] if not i % 2 else None,
            "prompt_token_ids": [i, 2**31 - 1, 0],
            "params": {"max_tokens": 5, "stop": [text or "x"], "temperature": 0.25},
            "meta": {text or "k": text},
            "custom_id": f"{text}-{i}",
        }
        for i, text in enumerate(AWKWARD)
    ]


def shared() -> dict[str, Any]:
    return {
        "status": "queued",
        "model": "m\tquoted\\",
        "priority": -3,
        "attempt": 0,
        "cancel_requested": False,
        "prompt_tokens": 3,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "output_text": "",
        "webhook_events": ["job.succeeded"],  # a JSON value shared by every row
        "queued_at": utcnow() - timedelta(seconds=5),
        "published_at": None,
    }


def read_back(settings: Settings, given: list[dict[str, Any]], common: dict[str, Any]) -> None:
    engine = make_db_engine(settings)
    try:
        sessions = make_sessionmaker(engine)
        with sessions.begin() as session:
            insert_jobs(session, common, iter(given))
        with sessions() as session:
            stored = {job.id: job for job in session.scalars(select(Job))}
    finally:
        engine.dispose()
    assert sorted(stored) == [row["id"] for row in given]
    for row in given:
        job = stored[row["id"]]
        for name, value in (row | common).items():
            assert getattr(job, name) == value, (row["id"], name)


def test_copy_text_round_trips_on_postgres(service_settings: Settings) -> None:
    read_back(service_settings, rows(), shared())


def test_executemany_round_trips_on_sqlite(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    upgrade(settings)
    read_back(settings, rows(), shared())


@pytest.mark.parametrize("count", [0, 1, 1201])
def test_every_row_of_a_stream_is_written(service_settings: Settings, count: int) -> None:
    """Across COPY chunks, and none at all."""
    given = [{"id": f"job_n{i:05d}", "prompt_token_ids": [i], "params": {}, "meta": {}} for i in range(count)]
    engine = make_db_engine(service_settings)
    try:
        with make_sessionmaker(engine).begin() as session:
            insert_jobs(session, shared(), (row for row in given))
            ids = session.scalars(select(Job.id).order_by(Job.id)).all()
    finally:
        engine.dispose()
    assert ids == [row["id"] for row in given]
