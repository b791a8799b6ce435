"""Nothing is lost: jobs of dead workers go back to the queue, and queued jobs without a message get one.
Each round also moves batches along (``worker/batches.py``)."""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from worker.batches import BatchKeeper
from worker.health import describe
from worker.host import Publish
from worker.store import JobStore, database_away

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
            self._try("reconcile", self.reconcile)
            if self.batches is not None:
                self._try("keeping batches", self.batches.keep)

    @staticmethod
    def _try(what: str, step: Callable[[], None]) -> None:
        """A failed round is tried again next round. A database outage gets one line (the flusher logs
        what waits on it), anything else its traceback."""
        try:
            step()
        except Exception as error:
            if not database_away(error):
                logger.exception(f"{what} failed")
                return
            logger.warning(f"{what} failed: the database is away", extra={"error": describe(error)})

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
