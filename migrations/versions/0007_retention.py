"""retention: jobs and files expire (expires_at), batches are kept until retained_until, which their
output_expires_after sets when they end; rows made before stay (NULL: kept until deleted)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

MOMENT = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("expires_at", MOMENT))
        jobs.create_index("ix_jobs_expires_at", ["expires_at"])
    with op.batch_alter_table("files") as files:
        files.add_column(sa.Column("expires_at", MOMENT))
        files.create_index("ix_files_expires_at", ["expires_at"])
    with op.batch_alter_table("batches") as batches:
        batches.add_column(sa.Column("output_expires_after", sa.Integer()))
        batches.add_column(sa.Column("retained_until", MOMENT))
        batches.create_index("ix_batches_retained_until", ["retained_until"])


def downgrade() -> None:
    with op.batch_alter_table("batches") as batches:
        batches.drop_index("ix_batches_retained_until")
        batches.drop_column("retained_until")
        batches.drop_column("output_expires_after")
    with op.batch_alter_table("files") as files:
        files.drop_index("ix_files_expires_at")
        files.drop_column("expires_at")
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_index("ix_jobs_expires_at")
        jobs.drop_column("expires_at")
