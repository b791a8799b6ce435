"""A benchmark's own PostgreSQL database, made anew and migrated: `fresh_settings(url, name)`."""

import psycopg

from core.settings import Settings
from migrations import upgrade


def fresh_settings(url: str, name: str) -> Settings:
    """Drops and creates database ``name`` on the server at ``url`` (postgresql://HOST:PORT), migrates
    it, and returns settings that use it."""
    with psycopg.connect(f"{url}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    settings = Settings(database_url=f"{url.replace('postgresql://', 'postgresql+psycopg://')}/{name}")
    upgrade(settings)
    return settings
