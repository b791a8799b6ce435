"""a replay batch (POST /v1/batches/{id}/replay): the batch it replays, and once it has ended how many
of its lines were identical to their originals, how many differ, and whether one model served both

Revision ID: 0013_breplay_batch_replay
Revises: 0012_order_fair_heads
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013_breplay_batch_replay"
down_revision = "0012_order_fair_heads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batches:
        batches.add_column(sa.Column("replay_of", sa.String(40)))
        batches.add_column(
            sa.Column("replay_counts", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"))
        )


def downgrade() -> None:
    with op.batch_alter_table("batches") as batches:
        batches.drop_column("replay_counts")
        batches.drop_column("replay_of")
