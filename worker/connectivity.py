"""How long this worker has reached the database without a failure, as its roles find out.

A worker may judge another dead (its heartbeat older than the heartbeat timeout) only once it has itself
been connected for a heartbeat timeout: after an outage nobody could heartbeat, and the others need that
long to write one again (worker/reconciler.py).
"""

import threading
import time


class Connectivity:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic; None: the last round trip failed, or none went yet

    def succeeded(self) -> None:
        with self._lock:
            self._since = self._since or time.monotonic()

    def failed(self) -> None:
        with self._lock:
            self._since = None

    def connected_for(self) -> float:
        """Seconds since the first success after the last failure; 0 while failing."""
        with self._lock:
            return 0.0 if self._since is None else time.monotonic() - self._since
