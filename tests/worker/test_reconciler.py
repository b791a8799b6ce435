"""The reconciler's judgement of other workers (worker/reconciler.py), on the real PostgreSQL: after a
database outage, when every heartbeat is stale, it requeues no job of a worker that beats again within a
heartbeat timeout of the database's return; a worker that stays silent still loses its jobs."""

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from core.db import make_db_engine, make_sessionmaker
from core.models import Worker, utcnow
from core.queue import make_celery
from core.settings import Settings
from core.states import JobStatus
from core.webhooks import Outbox
from tests.support.roles import MODEL, add_job, database_away, row
from tests.support.services import wait_for
from tests.worker.test_liveness import PRINT_AND_WAIT
from worker.batches import BatchKeeper
from worker.liveness import new_worker_id, this_process
from worker.reconciler import Reconciler
from worker.store import JobStore

TIMEOUT = 2.0  # the heartbeat timeout


@pytest.fixture
def store(service_settings: Settings) -> Iterator[JobStore]:
    engine = make_db_engine(service_settings)
    yield JobStore(make_sessionmaker(engine), MODEL)
    engine.dispose()


def running_on(store: JobStore, worker_id: str) -> str:
    job = store.claim(add_job(store), worker_id)
    assert job is not None
    store.heartbeat(worker_id, {})
    return job.id


def test_after_an_outage_only_workers_silent_for_a_timeout_of_connectivity_lose_their_jobs(
    service_settings, store
):
    live, silent = running_on(store, "live"), running_on(store, "silent")
    requeued: dict[str, float] = {}  # job id -> how long the reconciler had been connected
    reconciler = Reconciler(
        store, lambda job_id, _: requeued.update({job_id: connected()}), lambda *_: None, TIMEOUT, 60.0
    )
    connected = reconciler.connectivity.connected_for
    stop = threading.Event()
    rounds = threading.Thread(target=reconciler.run, args=(0.05, stop), daemon=True)
    rounds.start()
    try:
        wait_for(lambda: connected() > 0, 10, "a first round")
        with database_away(service_settings.database_url):
            wait_for(lambda: connected() == 0, 10, "the reconciler to meet the outage")
            time.sleep(TIMEOUT * 1.5)  # the outage outlasts the heartbeat timeout: every heartbeat is stale
        # The database is back. The live worker, also just reconnected, beats within a heartbeat timeout.
        wait_for(lambda: connected() > 0, 10, "the reconciler to reconnect")
        beat_after = TIMEOUT / 3
        wait_for(lambda: connected() >= beat_after, 10, "the live worker's first heartbeat to be due")
        keep_beating = threading.Thread(target=beat, args=(store, "live", stop), daemon=True)
        keep_beating.start()
        wait_for(lambda: silent in requeued, 10 * TIMEOUT, "the silent worker's job to be requeued")
    finally:
        stop.set()
        rounds.join(10)
    assert requeued[silent] >= TIMEOUT, "judged before others could heartbeat"
    assert live not in requeued, "a worker that beat again lost its job"
    assert (row(store, live).status, row(store, live).attempt) == (JobStatus.RUNNING, 1)
    assert row(store, silent).status == JobStatus.QUEUED


def beat(store: JobStore, worker_id: str, stop: threading.Event) -> None:
    while not stop.wait(TIMEOUT / 6):
        with suppress(OperationalError):
            store.heartbeat(worker_id, {})


def test_rounds_go_on_while_batch_jobs_end_all_the_time(service_settings, store):
    """The flusher wakes the reconciler at every end of a batch's job (to finalize a batch without waiting
    for a round); a batch whose jobs end at every step must not keep its rounds (orphans, probes, expiry)
    from coming."""
    batches = BatchKeeper(store.sessions, Outbox(service_settings, make_celery(service_settings)))
    reconciler = Reconciler(store, lambda *_: None, lambda *_: None, TIMEOUT, 60.0, batches)
    stop = threading.Event()
    rounds = threading.Thread(target=reconciler.run, args=(0.1, stop), daemon=True)

    def end_batch_jobs() -> None:
        while not stop.wait(0.005):
            reconciler.wake.set()

    ending = threading.Thread(target=end_batch_jobs, daemon=True)
    rounds.start()
    ending.start()
    try:
        wait_for(lambda: reconciler.connectivity.connected_for() > 0, 10, "a round")
    finally:
        stop.set()
        reconciler.wake.set()
        rounds.join(10)
        ending.join(10)
    assert not rounds.is_alive()


def test_a_worker_proven_dead_on_this_host_loses_its_jobs_at_the_first_round(store, caplog):
    """No heartbeat timeout (it is a minute here, and every heartbeat is fresh): a worker whose process is
    gone (worker/liveness.py) is dead now; a live one beside it keeps its job."""
    child = subprocess.Popen(
        [sys.executable, "-c", PRINT_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    gone = child.stdout.readline().strip()
    child.kill()
    child.wait()
    dead_job, live_job = running_on(store, "dead"), running_on(store, "live")
    store.heartbeat("dead", {}, process=gone)
    store.heartbeat("live", {}, process=this_process())
    requeued: list[str] = []
    reconciler = Reconciler(store, lambda job_id, _: requeued.append(job_id), lambda *_: None, 60.0, 60.0)
    reconciler.reconcile()  # its first round: connected for far less than the heartbeat timeout
    assert requeued == [dead_job]
    [said] = [r for r in caplog.records if r.getMessage() == "workers proven dead on this host"]
    assert said.workers == ["dead"]
    assert (row(store, dead_job).status, row(store, live_job).status) == (JobStatus.QUEUED, JobStatus.RUNNING)
    with store.sessions() as session:
        assert set(session.scalars(select(Worker.id))) == {"live"}, "the dead worker left the workers table"


def test_a_worker_restarted_under_its_predecessors_host_and_pid_does_not_keep_its_jobs(store):
    """A container restarted in place often gets the same host name and pid again (here: the same process).
    The new worker's heartbeats must not keep the dead one's running job from going back to the queue."""
    before, after = new_worker_id(), new_worker_id()
    host, _, pid = before.split(":")
    assert after.startswith(f"{host}:") and after.endswith(f":{pid}"), "the same host and pid"
    orphan = running_on(store, before)
    with store.sessions.begin() as session:  # the dead one's last heartbeat, long ago
        stale = utcnow() - timedelta(seconds=10 * TIMEOUT)
        session.execute(update(Worker).where(Worker.id == before).values(heartbeat_at=stale))
    own = running_on(store, after)
    assert store.requeue_orphans(TIMEOUT) == [(orphan, row(store, orphan).priority)]
    assert (row(store, orphan).status, row(store, own).status) == (JobStatus.QUEUED, JobStatus.RUNNING)
