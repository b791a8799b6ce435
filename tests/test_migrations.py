"""Alembic migrations upgrade and downgrade cleanly on PostgreSQL and on SQLite."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from core.models import Base
from core.settings import Settings
from migrations import downgrade, upgrade
from tests.services import postgres_admin, sqlalchemy_url


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
