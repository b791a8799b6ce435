"""Many job rows in one statement: ``COPY`` on PostgreSQL (about 3x an executemany), executemany elsewhere.

Rows may come from a generator: each is sent as soon as it is made, so PostgreSQL stores them while
the caller makes the next ones instead of all at the end.
"""

import itertools
from collections.abc import Iterable
from typing import Any

from pydantic_core import to_json
from sqlalchemy import JSON, insert
from sqlalchemy.orm import Session

from core.models import Job


def insert_jobs(session: Session, rows: Iterable[dict[str, Any]]) -> None:
    """``rows``: ``Job`` attributes by name, the same keys in the same order, every NOT NULL column given."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        session.execute(insert(Job), [first, *rows])
        return
    columns = [Job.__mapper__.attrs[name].columns[0] for name in first]  # type: ignore[attr-defined]
    as_json = [isinstance(column.type, JSON) for column in columns]
    statement = f"COPY {Job.__tablename__} ({', '.join(column.name for column in columns)}) FROM STDIN"
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor, cursor.copy(statement) as copy:
        for row in itertools.chain([first], rows):
            copy.write_row([_json(v) if j else v for v, j in zip(row.values(), as_json, strict=True)])


def _json(value: Any) -> str | None:
    """JSON text for a jsonb column (pydantic's serializer: several times faster than ``json.dumps``)."""
    return None if value is None else to_json(value).decode()
