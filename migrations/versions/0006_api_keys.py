"""API keys (only a hash stored) with per-key limits; the owner key of every job, batch and file

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OWNED = ("jobs", "batches", "files")


def upgrade() -> None:
    when = sa.DateTime(timezone=True)
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(8), nullable=False),
        sa.Column("created_at", when, nullable=False),
        sa.Column("last_used_at", when),
        sa.Column("revoked_at", when),
        sa.Column("expires_at", when),
        sa.Column("max_active_jobs", sa.Integer()),
        sa.Column("requests_per_second", sa.Float()),
        sa.Column("tokens_per_minute", sa.Integer()),
        sa.Column("max_tokens", sa.Integer()),
        sa.Column("max_n", sa.Integer()),
        sa.Column("max_prompt_tokens", sa.Integer()),
    )
    for table in OWNED:
        with op.batch_alter_table(table) as owned:
            owned.add_column(sa.Column("key_id", sa.String(36)))
            owned.create_foreign_key(f"fk_{table}_key_id", "api_keys", ["key_id"], ["id"])
    op.create_index("ix_jobs_key_id_status", "jobs", ["key_id", "status"])
    op.create_index("ix_batches_key_id", "batches", ["key_id"])
    op.create_index("ix_files_key_id", "files", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_files_key_id", "files")
    op.drop_index("ix_batches_key_id", "batches")
    op.drop_index("ix_jobs_key_id_status", "jobs")
    for table in OWNED:
        with op.batch_alter_table(table) as owned:
            owned.drop_constraint(f"fk_{table}_key_id", type_="foreignkey")
            owned.drop_column("key_id")
    op.drop_table("api_keys")
