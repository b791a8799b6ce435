"""a run's per-token times are appended a chunk per flush (job_token_times), not rewritten whole;
logprobs are stored as text (the old form, token ids, is cleared: only the waiting client ever read it)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _empty_array() -> str:
    return "'[]'::jsonb" if op.get_bind().dialect.name == "postgresql" else "'[]'"


def upgrade() -> None:
    op.create_table(
        "job_token_times",
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("first", sa.Integer(), primary_key=True),
        sa.Column("times_ms", JSON, nullable=False),
    )
    op.execute(
        "INSERT INTO job_token_times (job_id, attempt, first, times_ms) "
        f"SELECT id, attempt, 0, token_times_ms FROM jobs WHERE token_times_ms <> {_empty_array()}"
    )
    op.execute("UPDATE jobs SET token_logprobs = NULL")
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_column("token_times_ms")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("token_times_ms", JSON))
    bind = op.get_bind()
    chunks = bind.execute(
        sa.text(
            "SELECT c.job_id, c.first, c.times_ms FROM job_token_times c "
            "JOIN jobs ON jobs.id = c.job_id AND jobs.attempt = c.attempt ORDER BY c.job_id, c.first"
        )
    )
    times: dict[str, list[float]] = {}
    for job_id, first, chunk in chunks:
        run = times.setdefault(job_id, [])
        run.extend((json.loads(chunk) if isinstance(chunk, str) else chunk)[max(len(run) - first, 0) :])
    update = sa.text("UPDATE jobs SET token_times_ms = :times WHERE id = :id")
    for job_id, run in times.items():
        bind.execute(update.bindparams(sa.bindparam("times", type_=JSON)), {"id": job_id, "times": run})
    op.execute(f"UPDATE jobs SET token_times_ms = {_empty_array()} WHERE token_times_ms IS NULL")
    op.execute("UPDATE jobs SET token_logprobs = NULL")
    with op.batch_alter_table("jobs") as jobs:
        jobs.alter_column("token_times_ms", existing_type=JSON, nullable=False)
    op.drop_table("job_token_times")
