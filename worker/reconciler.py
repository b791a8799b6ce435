"""Nothing is lost: jobs of dead workers go back to the queue, and queued jobs without a message get one.
Each round also moves batches along (``worker/batches.py``), and every ``PAGEDQ_PURGE_INTERVAL`` it
deletes what retention has expired (``core/purge.py``). Between rounds, when a batch's job ends here
(the flusher says so), the batches whose jobs have all ended are finalized at once, not a round later.

A lost message is told from one still waiting in the broker by a probe, not by reading the broker: a
broker queue is first in, first out within a priority step, so when a probe published at time S is
consumed, every job message of its step published before S has been consumed too. A job of that step
still queued, last published before S − ``requeue_after`` (the margin covers a publish that lags its
row's stamp and clocks that differ), has lost its message; whichever worker consumes the probe
republishes it. This works with a backlog that never drains, and without one (the probe is consumed at
once). Each reconciler sends at most one probe per priority step per ``requeue_after``, and only for
steps that have queued jobs that old.
With fair share a message is a ticket for the fairest job (worker/fair.py), so a job may still be queued
because its message claimed a fairer one: that fairer job's message is still waiting, and the job's
republished message is one ticket more than needed, whose claim finds nothing and is dropped.

A silent worker is judged dead only by a reconciler connected for a heartbeat timeout since its last
failure (worker/connectivity.py): after a database outage every heartbeat is stale, and the first worker
back must not take the others' jobs before they could write one. A worker whose process is proven gone
(worker/liveness.py: same host and PID namespace) loses its jobs at the first round, outage or not; the
first round comes as the reconciler starts, so a worker restarted in place takes its jobs back at once.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from core.models import utcnow
from core.purge import Purger
from core.queue import celery_priority, priorities_at
from worker.batches import BatchKeeper
from worker.connectivity import Connectivity
from worker.flusher import Publish
from worker.health import describe
from worker.liveness import proven_dead
from worker.os_threads import name_this_thread
from worker.store import JobStore, database_away

logger = logging.getLogger("pagedq.worker")

Probe = Callable[[int, datetime], None]  # (broker priority step, published before) -> publish a probe
BATCH_CHECK_S = 0.5  # the least time between two looks for finished batches, however often batch jobs end


@dataclass
class Reconciler:
    store: JobStore
    publish: Publish
    probe: Probe
    heartbeat_timeout: float
    requeue_after: float
    batches: BatchKeeper | None = None  # expires, stops and finalizes batches
    purger: Purger | None = None  # deletes what retention has expired
    purge_interval: float = 300.0
    connectivity: Connectivity = field(default_factory=Connectivity)  # shared with the worker's other roles
    probed: dict[int, float] = field(default_factory=dict)  # step -> when this reconciler last probed it
    purged: float = -float("inf")  # when this reconciler last purged (monotonic)
    wake: threading.Event = field(default_factory=threading.Event)  # a batch's job ended here, or stop

    def run(self, interval: float, stop: threading.Event) -> None:
        """A round every ``interval`` seconds until ``stop`` (set ``wake`` with it: it cuts the wait)."""
        name_this_thread("pagedq-reconcile")
        next_round = time.monotonic()
        while not stop.is_set():
            woken = self.wake.wait(max(0.0, next_round - time.monotonic()))
            self.wake.clear()
            if stop.is_set():
                return
            if time.monotonic() >= next_round:  # first: batch jobs that end all the time must not starve it
                self._round()  # which finalizes what is done too
                next_round = time.monotonic() + interval
            elif woken and self.batches is not None:
                self._try("finalizing batches", self.batches.finalize_done)
                stop.wait(BATCH_CHECK_S)

    def _round(self) -> None:
        if self._try("reconcile", self.reconcile):
            self.connectivity.succeeded()
        if self.batches is not None:
            self._try("keeping batches", self.batches.keep)
        if self.purger is not None and time.monotonic() - self.purged >= self.purge_interval:
            self.purged = time.monotonic()
            self._try("purging expired objects", self.purger.purge)

    def _try(self, what: str, step: Callable[[], None]) -> bool:
        """A failed round is tried again next round. A database outage gets one line (the flusher logs
        what waits on it), anything else its traceback. Returns whether it went through."""
        try:
            step()
        except Exception as error:
            if not database_away(error):
                logger.exception(f"{what} failed")
                return False
            self.connectivity.failed()
            logger.warning(f"{what} failed: the database is away", extra={"error": describe(error)})
            return False
        return True

    def reconcile(self) -> None:
        beaten = self.connectivity.connected_for() >= self.heartbeat_timeout  # others could have beaten since
        self.requeue_orphans(self.heartbeat_timeout if beaten else None)
        self.probe_waiting_steps()

    def requeue_orphans(self, heartbeat_timeout: float | None) -> None:
        """The jobs of workers proven dead, and with ``heartbeat_timeout`` of those silent that long."""
        for job_id, priority in self.store.requeue_orphans(heartbeat_timeout, proven_dead):
            logger.warning("requeued the job of a dead or silent worker", extra={"job_id": job_id})
            self.publish(job_id, priority)

    def probe_waiting_steps(self) -> None:
        published_before = utcnow() - timedelta(seconds=self.requeue_after)
        steps = {celery_priority(p) for p in self.store.waiting_priorities(published_before)}
        for step in sorted(steps):
            if time.monotonic() - self.probed.get(step, -float("inf")) >= self.requeue_after:
                self.probe(step, published_before)
                self.probed[step] = time.monotonic()

    def republish_lost(self, step: int, published_before: datetime) -> None:
        """A probe of ``step`` was consumed: that step's older jobs still queued lost their message."""
        for job_id, priority in self.store.republish_due(published_before, priorities_at(step)):
            logger.warning("republished a queued job without a message", extra={"job_id": job_id})
            self.publish(job_id, priority)
