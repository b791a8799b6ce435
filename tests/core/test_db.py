"""The PostgreSQL engine's pool: a connection the server closed is replaced as it is taken (core/db.py)."""

import psycopg
from sqlalchemy import text

from core.db import make_db_engine, make_sessionmaker
from core.settings import Settings
from tests.support.services import POSTGRES_ADMIN_URL, wait_for


def test_a_pooled_connection_the_server_closed_is_replaced_as_it_is_taken(service_settings: Settings) -> None:
    engine = make_db_engine(service_settings, connections=1)
    sessions = make_sessionmaker(engine)

    def backend() -> int:
        with sessions() as session:
            return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())

    try:
        first = backend()
        assert backend() == first  # a live connection is kept
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [first])
            gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s"
            wait_for(lambda: admin.execute(gone, [first]).fetchone()[0], 10, "the backend to exit")
        assert backend() != first  # no error: the closed one was discarded, a new one made
    finally:
        engine.dispose()
