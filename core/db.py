"""Database connections: one SQLAlchemy engine per process, tuned per backend."""

import select
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from core.settings import Settings


def make_db_engine(settings: Settings, connections: int | None = None) -> Engine:
    """``hide_parameters``: a statement's parameters (prompts, metadata, webhook URLs) are never part of an
    exception's message, and so never of a log line. ``connections``: a pool of exactly that many, for
    users that know how many threads share it (the worker's roles); default, 10 and up to 20 more."""
    url = settings.resolved_database_url
    sized = {} if connections is None else {"pool_size": connections, "max_overflow": 0}
    if url.startswith("sqlite"):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"timeout": 30, "check_same_thread": False}, hide_parameters=True, **sized
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    pool = sized or {"pool_size": 10, "max_overflow": 20}
    # Last in, first out: the connection used last is taken again, so what it prepared (psycopg prepares a
    # statement on its fifth run on a connection) serves the next use, not a round robin's later turn.
    engine = create_engine(url, pool_use_lifo=True, hide_parameters=True, **pool)
    event.listen(engine, "checkout", _discard_if_closed)
    return engine


def _discard_if_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection the server has closed (restarted, or its backend terminated) is replaced as it
    is taken: its socket then reads as ready (the end of the stream, or the server's last error), which a
    look at it without waiting finds. This stands for ``pool_pre_ping``, whose ``SELECT 1`` cost every
    transaction a round trip (0.1-0.5 ms here, on a claim or a submission's write of 1-3 ms) and
    PostgreSQL a wakeup (bench/RESULTS.md, 2026-11-27). A connection that fails later, mid-use, fails its
    caller as before."""
    if dbapi_connection.closed or _readable(dbapi_connection.fileno()):
        raise DisconnectionError("the database closed this pooled connection")


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # WAL lets the API read while the worker writes; NORMAL sync is durable across process crashes.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions whose objects outlive the commit. A worker's reads, too, go through ``begin()`` (they end in
    COMMIT): a ROLLBACK makes psycopg drop every statement it prepared on the connection, and the claim's
    pick, run unprepared, cost ~1 ms of parsing and planning in PostgreSQL each time."""
    return sessionmaker(engine, expire_on_commit=False)


def autocommitting(session: Session) -> Connection:
    """The session's connection with each statement its own transaction: for work that is one statement
    (a first run's claim) or only reads (the pick), it saves the BEGIN and COMMIT round trips (a claim
    took ~0.5 ms less; the commit's WAL flush, most of a write's wait, stays). The session's first use
    must be this call (later calls return the same connection)."""
    if not session.in_transaction():
        return session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    connection = session.connection()
    if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        raise RuntimeError("the session began a transaction before it was made autocommitting")
    return connection
