"""embeddings: an embedding job's vectors (float32, little-endian, one after another); rows made before:
none

Revision ID: 0010_embedapi_embeddings
Revises: 0009
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_embedapi_embeddings"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("embeddings", sa.LargeBinary()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.drop_column("embeddings")
