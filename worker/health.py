"""Whether the worker can do its job, kept in a small status file that ``pagedq worker --check`` reads.

The worker has no HTTP server, so its health is a JSON file it rewrites at least every heartbeat period:
an operator or a compose healthcheck runs ``pagedq worker --check`` beside it (same environment, so the
same file). A file not refreshed within the heartbeat timeout means the worker is stuck or gone.
"""

import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.exc import SQLAlchemyError

logger = logging.getLogger("pagedq.worker")

State = Literal["starting", "healthy", "unhealthy", "stopped"]


def describe(error: BaseException) -> str:
    """``Class: first line``: SQLAlchemy's own message appends the statement and its parameters."""
    cause = getattr(error, "orig", None) or error
    first_line = next(iter(str(cause).splitlines()), "")
    return f"{type(error).__name__}: {first_line}".strip()


@dataclass
class WorkerHealth:
    path: Path
    refresh_every: float  # seconds between rewrites of an unchanged status
    worker_id: str = ""
    state: State = "starting"
    failing_since: datetime | None = None
    reason: str = ""
    _written_at: float = float("-inf")

    def failed(self, error: BaseException) -> None:
        """A write (or another database round trip of the flusher) failed."""
        if self.failing_since is None:
            self.failing_since = datetime.now(UTC)
        what = "the database" if isinstance(error, SQLAlchemyError) else "results"
        since = self.failing_since.isoformat(timespec="seconds")
        self.reason = f"cannot write to {what} since {since}: {describe(error)}"
        self.set("unhealthy")

    def succeeded(self, jobs: int) -> None:
        """A flush round went through: writes, cancel polls and the heartbeat."""
        self.failing_since, self.reason = None, ""
        self.set("healthy", jobs)

    def set(self, state: State, jobs: int | None = None) -> None:
        changed, self.state = state != self.state, state
        if changed or time.monotonic() - self._written_at >= self.refresh_every:
            self.write(jobs)

    def write(self, jobs: int | None = None) -> None:
        status: dict[str, Any] = {
            "state": self.state,
            "reason": self.reason,
            "worker_id": self.worker_id,
            "pid": os.getpid(),
            "updated_at": datetime.now(UTC).isoformat(),
            "jobs": jobs,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(status))
            temporary.replace(self.path)  # atomic: a reader never sees half a file
            self._written_at = time.monotonic()
        except OSError as error:
            logger.warning(
                "could not write the status file", extra={"path": str(self.path), "error": str(error)}
            )


def check(path: Path, stale_after: float) -> tuple[bool, str]:
    """(healthy, one line for the operator) from a worker's status file."""
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return False, f"unhealthy: no readable status file at {path} (is the worker running?): {error}"
    updated = datetime.fromisoformat(status["updated_at"])
    age = (datetime.now(UTC) - updated).total_seconds()
    if age > stale_after:
        return (
            False,
            f"unhealthy: status not updated since {updated.isoformat(timespec='seconds')} ({age:.0f} s)",
        )
    state, reason = status["state"], status.get("reason") or ""
    if state == "healthy":
        return True, f"healthy: {status.get('jobs') or 0} jobs held (worker {status['worker_id']})"
    if state == "unhealthy":
        return False, f"unhealthy: {reason}"
    return False, f"{state}: worker {status['worker_id']}"
