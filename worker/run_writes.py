"""A flush's writes of many runs: their progress and results, and their new token times.

On PostgreSQL each is one statement however many runs a flush writes: every column's values are bound
as one array and ``unnest`` turns them back into rows (at 256 running jobs a flush comes about every
token, and a statement per job was a statement per token). The update returns the ids it matched, so
the runs no longer ours are known without asking. SQLite runs the same writes a row at a time.
"""

import json
from functools import cache
from typing import Any

from sqlalchemy import (
    JSON,
    Connection,
    Insert,
    Integer,
    String,
    Text,
    Update,
    bindparam,
    cast,
    column,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import ColumnElement
from sqlalchemy.sql.expression import ColumnClause

from core.models import Job, TokenTimes
from core.states import JobStatus

JOBS = Job.__table__
RUN_KEYS = (column("run_id", String), column("run_attempt", Integer))
TEXT_KEYS = (column("text_from", Integer), column("text_piece", Text))  # ``Progress.text``'s parameters


def append_text(text_from: ColumnElement[Any], text_piece: ColumnElement[Any]) -> ColumnElement[str]:
    """The first choice's text cut to ``text_from`` characters, then the new piece: a retry after an unknown
    outcome, or a rerun's first flush, writes the same."""
    return func.substr(JOBS.c.output_text, 1, text_from, type_=Text).concat(text_piece)


APPEND_TEXT = append_text(bindparam("text_from", type_=Integer), bindparam("text_piece", type_=Text))
JSON_KEYS = {
    c.name for table in (JOBS, TokenTimes.__table__) for c in table.columns if isinstance(c.type, JSON)
}


def update_runs(connection: Connection, keys: tuple[str, ...], rows: list[dict[str, Any]]) -> set[str]:
    """Write ``rows`` (each a run's ``run_id``, ``run_attempt``, the text's parameters and ``keys``' values)
    where the run is still running; returns the ids written. SQLite, which cannot say which rows matched,
    returns them all or, when some did not, none."""
    if connection.dialect.name == "postgresql":
        return set(connection.execute(_unnested_update(keys), _arrays(rows)).scalars())
    matched = connection.execute(ROW_UPDATE, rows).rowcount
    return {row["run_id"] for row in rows} if matched == len(rows) else set()


def append_token_times(connection: Connection, chunks: list[dict[str, Any]]) -> None:
    """New chunks of token times; the same chunk again (a retry after an unknown outcome) replaces it."""
    if connection.dialect.name == "postgresql":
        connection.execute(_unnested_insert(), _arrays(chunks))
    else:
        connection.execute(_replacing(sqlite.insert(TokenTimes)), chunks)


def _replacing(statement: Any) -> Insert:
    """``statement`` (PostgreSQL's or SQLite's INSERT of token times) replacing a chunk already there."""
    excluded = {"times_ms": statement.excluded.times_ms, "token_ids": statement.excluded.token_ids}
    return statement.on_conflict_do_update(index_elements=["job_id", "attempt", "first"], set_=excluded)


def _arrays(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """``rows`` as one list per key, JSON values serialized as SQLAlchemy would (None: JSON's null)."""
    return {
        key: [json.dumps(row[key]) for row in rows] if key in JSON_KEYS else [row[key] for row in rows]
        for key in rows[0]
    }


def _running(run_id: ColumnElement[Any], run_attempt: ColumnElement[Any]) -> tuple[ColumnElement[bool], ...]:
    return JOBS.c.id == run_id, JOBS.c.attempt == run_attempt, JOBS.c.status == JobStatus.RUNNING


# A row at a time: the SET clause is the text's append and the parameters' other keys (executemany).
ROW_UPDATE = (
    update(JOBS)
    .where(*_running(bindparam("run_id"), bindparam("run_attempt")))
    .values(output_text=APPEND_TEXT)
)


@cache
def _unnested_update(keys: tuple[str, ...]) -> Update:
    columns = (*RUN_KEYS, *TEXT_KEYS, *(column(key, JOBS.c[key].type) for key in keys))
    run = _unnested(columns, "run")
    return (
        update(JOBS)
        .where(*_running(run["run_id"], run["run_attempt"]))
        .values(
            output_text=append_text(run["text_from"], run["text_piece"]), **{key: run[key] for key in keys}
        )
        .returning(JOBS.c.id)
    )


@cache
def _unnested_insert() -> Insert:
    columns = tuple(column(c.name, c.type) for c in TokenTimes.__table__.columns)
    chunks = _unnested(columns, "chunk")
    return _replacing(postgresql.insert(TokenTimes).from_select(list(chunks), select(*chunks.values())))


def _unnested(columns: tuple[ColumnClause[Any], ...], name: str) -> dict[str, ColumnElement[Any]]:
    """The columns of ``unnest(:a, :b, ...) AS name(a, b, ...)``, one array parameter per column, named as
    it. JSON travels as text (``_arrays``: a list value would be taken for a dimension of the array) and is
    cast back."""
    sent = [column(c.name, Text) if isinstance(c.type, JSON) else c for c in columns]
    arrays = [bindparam(c.name, type_=postgresql.ARRAY(c.type)) for c in sent]
    rows = func.unnest(*arrays).table_valued(*sent).render_derived(name=name)
    return {
        c.name: cast(rows.c[c.name], c.type) if isinstance(c.type, JSON) else rows.c[c.name] for c in columns
    }
