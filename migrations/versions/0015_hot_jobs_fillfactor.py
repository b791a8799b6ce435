"""jobs pages half filled by inserts, so that a running job's flushes update its row in place (HOT):
rows made before keep their pages until rewritten

Revision ID: 0015_hot_jobs_fillfactor
Revises: 0014_weights_worker_weights
Create Date: 2026-11-26
"""

from alembic import op

revision = "0015_hot_jobs_fillfactor"
down_revision = "0014_weights_worker_weights"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs RESET (fillfactor)")
