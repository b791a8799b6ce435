"""The worker's database connections, by who uses them: every pool fits the threads that use it, so no
thread waits for a pooled connection (nor times out on one), and the heartbeat has one of its own.

A worker runs one Celery thread per seat (``PAGEDQ_WORKER_CONCURRENCY``, 256 on a GPU). Each needs the
database only to claim its job (a pick and an UPDATE, milliseconds), so they take turns on
``CLAIM_TURNS`` connections (worker/claimer.py), holding none while they wait for a turn or for their
run to end. The flusher and the reconciler have one each; the heartbeat, its own engine.
"""

import logging
import threading
from dataclasses import dataclass, field

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_db_engine, make_sessionmaker
from core.settings import Settings

# A claim holds its connection for a few ms: its pick one at a time in the worker (worker/store.py), its
# UPDATE beside the other turns'; more turns than this only queue in PostgreSQL and take connections from
# other workers.
CLAIM_TURNS = 4

logger = logging.getLogger(__name__)

# Who uses the jobs engine at once: Celery threads in turns (claims and the reconciler's probes), the
# flusher thread and the reconciler thread.
JOBS_POOL_USERS = {"claim turns": CLAIM_TURNS, "flusher": 1, "reconciler": 1}
HEARTBEAT_POOL_USERS = {"heartbeat": 1}


@dataclass
class WorkerConnections:
    jobs: Engine
    heartbeat: Engine
    turns: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(CLAIM_TURNS))

    @classmethod
    def connect(cls, settings: Settings) -> "WorkerConnections":
        return cls(
            make_db_engine(settings, connections=sum(JOBS_POOL_USERS.values())),
            make_db_engine(settings, connections=sum(HEARTBEAT_POOL_USERS.values())),
        )

    @property
    def job_sessions(self) -> sessionmaker[Session]:
        return make_sessionmaker(self.jobs)

    @property
    def heartbeat_sessions(self) -> sessionmaker[Session]:
        return make_sessionmaker(self.heartbeat)

    def dispose(self) -> None:
        self.jobs.dispose()
        self.heartbeat.dispose()


def warn_without_autovacuum(engine: Engine) -> None:
    """A queued job that leaves the queue keeps its entry in the pick's index until a vacuum, and every claim
    walks the entries left (migrations/versions/0018_vacuum_jobs_autovacuum.py): without autovacuum, the
    claims slow down with each batch, so a PostgreSQL with it off is worth a warning at the start."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as connection:
        if connection.exec_driver_sql("SHOW autovacuum").scalar() == "off":
            logger.warning(
                "PostgreSQL's autovacuum is off: every claim walks the index entries of the jobs claimed, "
                "cancelled or purged since the last VACUUM of jobs; turn it on, or VACUUM jobs often",
                extra={"database": connection.engine.url.render_as_string(hide_password=True)},
            )
