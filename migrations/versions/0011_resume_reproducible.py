"""reproducible and resumable jobs: each flush's output token ids beside its token times (a crashed run
resumes from them); a job's output token ids per choice, the runs it took (each one's resumed_from_token),
what served it (model and tokenizer digests, version, dtype, kernels) and the job it replays

Revision ID: 0011_resume_reproducible
Revises: 0010_embedapi_embeddings
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0011_resume_reproducible"
down_revision = "0010_embedapi_embeddings"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("job_token_times") as chunks:
        chunks.add_column(sa.Column("token_ids", JSON))
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("output_token_ids", JSON))
        jobs.add_column(sa.Column("runs", JSON))
        jobs.add_column(sa.Column("served_by", JSON))
        jobs.add_column(sa.Column("replay_of", sa.String(40)))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        for column in ("replay_of", "served_by", "runs", "output_token_ids"):
            jobs.drop_column(column)
    with op.batch_alter_table("job_token_times") as chunks:
        chunks.drop_column("token_ids")
