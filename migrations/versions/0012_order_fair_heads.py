"""the order a batch runs in: a job's prefix_key (its prompt's leading blocks, hashed as the engine's
prefix cache does), each worker's published prefix_keys, the index the claim's pick walks (a head per
owner, priority and window instead of every queued row), and a batch's estimated_completion_at and
at_risk_at; rows made before: none of them

Revision ID: 0012_order_fair_heads
Revises: 0011_resume_reproducible
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012_order_fair_heads"
down_revision = "0011_resume_reproducible"
branch_labels = None
depends_on = None

# worker/fair.py's GROUP, then its order within a group; only queued jobs (a partial index)
FAIR_HEADS = [
    "model",
    sa.text("coalesce(key_id, '')"),
    "priority",
    sa.text("coalesce(deadline_at - queued_at, interval '-1 second')"),
    "queued_at",
    "id",
]
QUEUED = "status = 'queued' AND NOT cancel_requested"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("prefix_key", sa.BigInteger()))
    with op.batch_alter_table("batches") as batches:
        batches.add_column(sa.Column("estimated_completion_at", sa.DateTime(timezone=True)))
        batches.add_column(sa.Column("at_risk_at", sa.DateTime(timezone=True)))
    with op.batch_alter_table("workers") as workers:
        workers.add_column(sa.Column("prefix_keys", sa.JSON().with_variant(postgresql.JSONB(), "postgresql")))
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_jobs_fair_heads", "jobs", FAIR_HEADS, postgresql_where=sa.text(QUEUED))
        held = sa.text(f"{QUEUED} AND prefix_key IS NOT NULL")
        op.create_index("ix_jobs_queued_prefix", "jobs", ["prefix_key", "id"], postgresql_where=held)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_jobs_queued_prefix", "jobs")
        op.drop_index("ix_jobs_fair_heads", "jobs")
    with op.batch_alter_table("workers") as workers:
        workers.drop_column("prefix_keys")
    with op.batch_alter_table("batches") as batches:
        batches.drop_column("at_risk_at")
        batches.drop_column("estimated_completion_at")
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_column("prefix_key")
