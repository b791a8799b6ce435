"""jobs and workers

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text()),
        sa.Column("messages", JSON),
        sa.Column("prompt_token_ids", JSON, nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("metadata", JSON, nullable=False),
        sa.Column("webhook_url", sa.Text()),
        sa.Column("idempotency_key", sa.String(255), unique=True),
        sa.Column("request_hash", sa.String(64)),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(120)),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("output_text", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(16)),
        sa.Column("error", sa.Text()),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("token_times_ms", JSON, nullable=False),
        sa.Column("queued_at", TIME, nullable=False),
        sa.Column("published_at", TIME),
        sa.Column("started_at", TIME),
        sa.Column("first_token_at", TIME),
        sa.Column("finished_at", TIME),
    )
    op.create_index("ix_jobs_status_queued_at", "jobs", ["status", "queued_at"])
    op.create_index("ix_jobs_worker_id", "jobs", ["worker_id"])
    op.create_table(
        "workers",
        sa.Column("id", sa.String(120), primary_key=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("started_at", TIME, nullable=False),
        sa.Column("heartbeat_at", TIME, nullable=False),
        sa.Column("stats", JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_index("ix_jobs_worker_id", "jobs")
    op.drop_index("ix_jobs_status_queued_at", "jobs")
    op.drop_table("jobs")
