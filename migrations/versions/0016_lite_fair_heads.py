"""the claim's pick on SQLite through the groups' heads too (worker/fair.py): ix_jobs_fair_heads_lite, and
ix_jobs_queued_prefix_lite for step 5's probe of a batch's lines by prefix key (a 2,000-line batch in the
embedded mode ordered every queued row at each claim)

Revision ID: 0016_lite_fair_heads
Revises: 0015_hot_jobs_fillfactor
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_lite_fair_heads"
down_revision = "0015_hot_jobs_fillfactor"
branch_labels = None
depends_on = None

# core/models.LITE_WINDOW, as it was when this ran
WINDOW = "coalesce(round((julianday(deadline_at) - julianday(queued_at)) * 86400000), -1)"
FAIR_HEADS = ["model", sa.text("coalesce(key_id, '')"), "priority", sa.text(WINDOW), "queued_at"]
QUEUED = "status = 'queued' AND cancel_requested = 0"


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.create_index("ix_jobs_fair_heads_lite", "jobs", [*FAIR_HEADS, "id"], sqlite_where=sa.text(QUEUED))
        held = sa.text(f"{QUEUED} AND prefix_key IS NOT NULL")
        columns = [*FAIR_HEADS, "prefix_key", "id"]
        op.create_index("ix_jobs_queued_prefix_lite", "jobs", columns, sqlite_where=held)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index("ix_jobs_queued_prefix_lite", "jobs")
        op.drop_index("ix_jobs_fair_heads_lite", "jobs")
