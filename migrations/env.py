"""Alembic's environment: runs revisions online against ``sqlalchemy.url`` from the config."""

from alembic import context
from sqlalchemy import create_engine, pool

from core.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None, "sqlalchemy.url is set by migrations.alembic_config"
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        # Batch mode lets ALTER TABLE work on SQLite, the embedded default.
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
