"""batches, files and webhook deliveries; jobs learn their batch, line and events

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("input_file_id", sa.String(40), sa.ForeignKey("files.id"), nullable=False),
        sa.Column("output_file_id", sa.String(40), sa.ForeignKey("files.id")),
        sa.Column("error_file_id", sa.String(40), sa.ForeignKey("files.id")),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("metadata", JSON),
        sa.Column("errors", JSON),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("webhook_url", sa.Text()),
        sa.Column("webhook_events", JSON),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        *(
            sa.Column(name, TIME)
            for name in (
                "expires_at",
                "in_progress_at",
                "finalizing_at",
                "completed_at",
                "failed_at",
                "expired_at",
                "cancelling_at",
                "cancelled_at",
            )
        ),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("webhook_events", JSON))
        jobs.add_column(sa.Column("batch_id", sa.String(40)))
        jobs.add_column(sa.Column("custom_id", sa.String(512)))
        jobs.add_column(sa.Column("endpoint", sa.String(64)))
        jobs.create_foreign_key("fk_jobs_batch_id", "batches", ["batch_id"], ["id"])
        jobs.create_index("ix_jobs_batch_id_status", ["batch_id", "status"])
        jobs.create_index("ix_jobs_finished_at", ["finished_at"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("event_type", sa.String(32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id")),
        sa.Column("batch_id", sa.String(40), sa.ForeignKey("batches.id")),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", JSON, nullable=False),
        sa.Column("next_attempt_at", TIME),
        sa.Column("created_at", TIME, nullable=False),
    )
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"])
    op.create_index("ix_webhook_deliveries_batch_id", "webhook_deliveries", ["batch_id"])
    op.create_index("ix_webhook_deliveries_status_next", "webhook_deliveries", ["status", "next_attempt_at"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_index("ix_jobs_finished_at")
        jobs.drop_index("ix_jobs_batch_id_status")
        jobs.drop_constraint("fk_jobs_batch_id", type_="foreignkey")
        for name in ("endpoint", "custom_id", "batch_id", "webhook_events"):
            jobs.drop_column(name)
    op.drop_index("ix_batches_status", "batches")
    op.drop_table("batches")
    op.drop_table("files")
