"""which process each worker is (boot id, PID namespace, pid, start time), so a reconciler on the same host
can prove it dead and requeue its jobs without waiting for its heartbeat to age (worker/liveness.py); rows
made before: none, judged by their heartbeat alone

Revision ID: 0017_process_worker_process
Revises: 0016_lite_fair_heads
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_process_worker_process"
down_revision = "0016_lite_fair_heads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        workers.add_column(sa.Column("process", sa.String(120)))


def downgrade() -> None:
    with op.batch_alter_table("workers") as workers:
        workers.drop_column("process")
