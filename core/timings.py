"""A job's derived timings, for its API view, its batch output line and the latency histograms alike.

In milliseconds rounded to the microsecond; None until both ends exist:

- ``queue_time_ms`` = started_at − queued_at: waiting for a worker's engine to schedule the job.
- ``time_to_first_token_ms`` = first_token_at − started_at: the engine's prefill latency. The client's
  end-to-end time to first token is ``queue_time_ms + time_to_first_token_ms``.
- ``e2e_latency_ms`` = finished_at − queued_at: submission to final result.
- ``mean_time_per_output_token_ms`` = (last token − first token) / (tokens − 1), from ``token_times_ms``
  (when each generated token was produced, in ms since started_at).
- ``inter_token_ms``: the gaps between consecutive tokens (the histogram's inter-token latency).
"""

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from contract.token_times import DECIMALS  # milliseconds to the microsecond, everywhere


class Stamped(Protocol):
    queued_at: datetime
    started_at: datetime | None
    first_token_at: datetime | None
    finished_at: datetime | None


class TimedJob(Stamped, Protocol):
    @property
    def token_times_ms(self) -> list[float]: ...


@dataclass(frozen=True)
class Timings:
    queue_time_ms: float | None
    time_to_first_token_ms: float | None
    e2e_latency_ms: float | None
    mean_time_per_output_token_ms: float | None
    inter_token_ms: list[float]

    def reported(self) -> dict[str, Any]:
        """The four figures a job's view and its batch output line report."""
        return {
            "queue_time_ms": self.queue_time_ms,
            "time_to_first_token_ms": self.time_to_first_token_ms,
            "e2e_latency_ms": self.e2e_latency_ms,
            "mean_time_per_output_token_ms": self.mean_time_per_output_token_ms,
        }


def timings(job: TimedJob) -> Timings:
    times = job.token_times_ms
    mean_gap = ms((times[-1] - times[0]) / (len(times) - 1)) if len(times) > 1 else None
    return Timings(
        queue_time_ms=queue_time_ms(job),
        time_to_first_token_ms=time_to_first_token_ms(job),
        e2e_latency_ms=e2e_latency_ms(job),
        mean_time_per_output_token_ms=mean_gap,
        inter_token_ms=[ms(later - earlier) for earlier, later in itertools.pairwise(times)],
    )


# The figures that need no per-token times, for readers of many jobs' stamps alone (the console's charts).
def queue_time_ms(job: Stamped) -> float | None:
    return _between(job.queued_at, job.started_at)


def time_to_first_token_ms(job: Stamped) -> float | None:
    return _between(job.started_at, job.first_token_at)


def e2e_latency_ms(job: Stamped) -> float | None:
    return _between(job.queued_at, job.finished_at)


def joined(chunks: Iterable[tuple[int, list[float]]]) -> list[float]:
    """A run's per-token times from its stored chunks ``(index of the first, times)``, in index order.

    A chunk written again after a commit whose outcome was unknown may overlap the one before: each
    index counts once."""
    times: list[float] = []
    for first, chunk in chunks:
        times.extend(chunk[max(len(times) - first, 0) :])
    return times


def ms(value: float) -> float:
    return round(value, DECIMALS)


def _between(start: datetime | None, end: datetime | None) -> float | None:
    return ms((end - start).total_seconds() * 1000) if start and end else None
