"""Alembic migrations upgrade and downgrade cleanly on PostgreSQL and on SQLite."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.orm import Session

from core.models import Base, Job
from core.settings import Settings
from migrations import downgrade, upgrade
from tests.support.services import postgres_admin, sqlalchemy_url


def columns_by_table(url: str) -> dict[str, set[str]]:
    engine = create_engine(url)
    try:
        schema = inspect(engine)
        names = set(schema.get_table_names()) - {"alembic_version"}
        return {name: {c["name"] for c in schema.get_columns(name)} for name in names}
    finally:
        engine.dispose()


def check_round_trip(settings: Settings) -> None:
    url = settings.resolved_database_url
    models = {name: {c.name for c in table.columns} for name, table in Base.metadata.tables.items()}
    assert columns_by_table(url) == {}
    upgrade(settings)
    assert columns_by_table(url) == models
    downgrade(settings)
    assert columns_by_table(url) == {}
    upgrade(settings)
    assert columns_by_table(url) == models


def test_migrations_round_trip_on_sqlite(tmp_path: Path) -> None:
    check_round_trip(Settings(data_dir=tmp_path))


@pytest.fixture
def empty_postgres() -> Iterator[str]:
    name = f"pagedq_test_migrations_{os.getpid()}"
    with postgres_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield sqlalchemy_url(name)
    with postgres_admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrations_round_trip_on_postgres(empty_postgres: str) -> None:
    check_round_trip(Settings(database_url=empty_postgres))


def check_token_times_move_to_chunks_and_back(settings: Settings) -> None:
    """0005 keeps each job's per-token times: into one chunk of its run, and back into the column."""
    url = settings.resolved_database_url
    upgrade(settings, "0004")
    engine = create_engine(url)
    columns = "id, status, model, priority, prompt_token_ids, params, metadata, attempt, cancel_requested, "
    columns += "output_text, prompt_tokens, completion_tokens, cached_tokens, token_times_ms, queued_at"
    insert = text(
        f"INSERT INTO jobs ({columns}) VALUES (:id, 'succeeded', 'm', 0, '[1]', '{{}}', '{{}}', 2, false, "
        "'', 1, 2, 0, :times, '2026-11-23 12:00:00+00:00')"
    )
    try:
        with engine.begin() as connection:
            connection.execute(insert, {"id": "job_timed", "times": "[1.5, 2.5]"})
            connection.execute(insert, {"id": "job_untimed", "times": "[]"})
        upgrade(settings)
        with Session(engine) as session:
            jobs = {job.id: job for job in session.scalars(select(Job))}
        assert jobs["job_timed"].token_times_ms == [1.5, 2.5] and jobs["job_untimed"].token_times_ms == []
        downgrade(settings, "0004")
        with engine.connect() as connection:
            rows = dict(connection.execute(text("SELECT id, token_times_ms FROM jobs")).all())
        assert {k: json.loads(v) if isinstance(v, str) else v for k, v in rows.items()} == {
            "job_timed": [1.5, 2.5],
            "job_untimed": [],
        }
    finally:
        engine.dispose()


def test_token_times_survive_the_upgrade_on_sqlite(tmp_path: Path) -> None:
    check_token_times_move_to_chunks_and_back(Settings(data_dir=tmp_path))


def test_token_times_survive_the_upgrade_on_postgres(empty_postgres: str) -> None:
    check_token_times_move_to_chunks_and_back(Settings(database_url=empty_postgres))
