"""jobs vacuumed after a fixed number of dead rows, its indexes every time: a queued job that leaves the
queue (claimed, cancelled, purged) keeps its entry in ``ix_jobs_fair_heads`` until a vacuum removes it, and
every claim's pick walks the entries left (a take 1.9 ms with none, 25 ms with 50,000: bench/RESULTS.md,
2026-11-29). Autovacuum's default waits for 20% of the table, tens of thousands of rows with a month of
jobs kept, and PostgreSQL 14 and later skip the indexes when the dead rows sit on under 2% of the table's
pages, as a queue's do; rows made before: the next vacuum

Revision ID: 0018_vacuum_jobs_autovacuum
Revises: 0017_process_worker_process
Create Date: 2026-11-29
"""

from alembic import op

revision = "0018_vacuum_jobs_autovacuum"
down_revision = "0017_process_worker_process"
branch_labels = None
depends_on = None

VACUUMED = {
    "autovacuum_vacuum_scale_factor": "0",
    "autovacuum_vacuum_threshold": "2000",
    "vacuum_index_cleanup": "on",
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"ALTER TABLE jobs SET ({', '.join(f'{name} = {value}' for name, value in VACUUMED.items())})"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE jobs RESET ({', '.join(VACUUMED)})")
