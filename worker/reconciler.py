"""Nothing is lost: jobs of dead workers go back to the queue, and queued jobs without a message get one.
Each round also moves batches along (``worker/batches.py``)."""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from worker.batches import BatchKeeper
from worker.host import Publish
from worker.store import JobStore

logger = logging.getLogger("pagedq.worker")


@dataclass
class Reconciler:
    store: JobStore
    publish: Publish
    queue_depth: Callable[[], int]
    heartbeat_timeout: float
    requeue_after: float
    batches: BatchKeeper | None = None  # expires, stops and finalizes batches

    def run(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                self.reconcile()
            except Exception:  # broker or database away: try again next round
                logger.exception("reconcile failed")
            try:
                if self.batches is not None:
                    self.batches.keep()
            except Exception:
                logger.exception("keeping batches failed")

    def reconcile(self) -> None:
        for job_id, priority in self.store.requeue_orphans(self.heartbeat_timeout):
            logger.warning("requeued the job of a silent worker", extra={"job_id": job_id})
            self.publish(job_id, priority)
        # Workers hold only jobs they have claimed (prefetch = seats), so with nothing waiting in the
        # broker, a job still queued long after its last publish has lost its message.
        if self.queue_depth() > 0:
            return
        for job_id, priority in self.store.republish_due(self.requeue_after):
            logger.warning("republished a queued job without a message", extra={"job_id": job_id})
            self.publish(job_id, priority)
