"""The heartbeat thread: the worker's liveness, written on a database connection of its own.

Other workers requeue the jobs of a worker whose heartbeat is older than ``PAGEDQ_HEARTBEAT_TIMEOUT``, so a
heartbeat must never wait behind job work: not for a pooled connection that claims hold, nor behind a
slow flush. It beats while the flusher's writes work: a worker that cannot write its results lets others
take its jobs over once its heartbeat ages.
"""

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from worker.connectivity import Connectivity
from worker.health import describe
from worker.liveness import this_process
from worker.os_threads import name_this_thread
from worker.store import JobStore

logger = logging.getLogger("pagedq.worker")


@dataclass
class Heartbeat:
    store: JobStore  # on the heartbeat's own engine (worker/connections.py)
    worker_id: str
    period: float
    engine_stats: Callable[[], dict[str, float]]
    writes_work: Callable[[], bool]  # the flusher's last round went through
    connectivity: Connectivity
    held_prefixes: Callable[[], Collection[int]] = tuple  # published for the other workers' claims
    weights: Callable[[], dict[str, Any] | None] = lambda: None  # the engine's, read once it is built

    def __post_init__(self) -> None:
        self._weights: dict[str, Any] | None = None
        self._process = this_process()  # lets a reconciler beside us prove us dead (worker/liveness.py)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pagedq-heartbeat", daemon=True)
        self._last_tokens, self._last_time = 0.0, time.monotonic()

    def start(self) -> None:
        """Registers the worker with its engine's weights (raises if the database is away), then beats
        every period."""
        self._weights = self.weights()
        self.store.heartbeat(
            self.worker_id, self.engine_stats(), weights=self._weights, process=self._process
        )
        self.connectivity.succeeded()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and leave the workers table."""
        self._stopping.set()
        self._thread.join(timeout=30)
        try:
            self.store.remove_worker(self.worker_id)
        except SQLAlchemyError as error:  # our heartbeats stop all the same: we age out of the table
            logger.warning("could not leave the workers table", extra={"error": describe(error)})

    def _run(self) -> None:
        name_this_thread("pagedq-heartbeat", bookkeeping=False)  # liveness first
        while not self._stopping.wait(self.period):
            if self.writes_work():
                self._beat()

    def _beat(self) -> None:
        now, stats = time.monotonic(), self.engine_stats()
        tokens = stats.get("num_generated_tokens", 0.0)
        rate = (tokens - self._last_tokens) / (now - self._last_time)
        try:
            beat = stats | {"tokens_per_s": rate}
            self.store.heartbeat(self.worker_id, beat, self.held_prefixes(), self._weights, self._process)
        except SQLAlchemyError as error:  # the flusher's failing rounds say it; so does health
            self.connectivity.failed()
            logger.debug("heartbeat failed", extra={"error": describe(error)})
            return
        self.connectivity.succeeded()
        self._last_tokens, self._last_time = tokens, now
