"""each worker's engine's weights as loaded (types, bytes, kernels), published with its heartbeat for
/v1/models and /readyz; rows made before: none

Revision ID: 0014_weights_worker_weights
Revises: 0013_breplay_batch_replay
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014_weights_worker_weights"
down_revision = "0013_breplay_batch_replay"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        workers.add_column(sa.Column("weights", sa.JSON().with_variant(postgresql.JSONB(), "postgresql")))


def downgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        workers.drop_column("weights")
