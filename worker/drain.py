"""A drain's two deadlines: when a stopping worker requeues the jobs still running, and when it stops
retrying the writes that fail and lets those runs go unwritten (their messages go back to the broker)."""

import time
from dataclasses import dataclass


@dataclass
class Drain:
    write_grace: float  # after the drain deadline, how long unwritten writes are retried
    deadline: float | None = None  # monotonic; None: not draining, claims go on
    give_up_at: float | None = None

    @property
    def started(self) -> bool:
        return self.deadline is not None

    def begin(self, grace: float) -> None:
        """Jobs still running in ``grace`` seconds are requeued; a second drain can only bring it closer."""
        deadline = time.monotonic() + grace
        self.deadline = min(deadline, self.deadline or deadline)
        self.give_up_at = self.deadline + self.write_grace

    def seconds_to_deadline(self) -> float | None:
        """Until the drain deadline; None when not draining or already past it."""
        left = None if self.deadline is None else self.deadline - time.monotonic()
        return left if left is not None and left > 0 else None

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def past_give_up(self) -> bool:
        return self.give_up_at is not None and time.monotonic() >= self.give_up_at
