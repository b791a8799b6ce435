"""Per-token times, one definition for the library and the service (#32 item 17): one time per output
token (of the first sample, or per beam step), in milliseconds since the run started, rounded to the
microsecond. The library's run starts when the request is added (``RequestMetrics.arrival_time``), the
service's when a worker claims the job (its ``started_at``), so ``metrics.token_times_ms`` and a job's
``token_times_ms`` mean the same. The engine's raw stamps (``metrics.token_times``, ``time.monotonic()``
seconds) are what both are made from.
"""

from collections.abc import Iterable

DECIMALS = 3  # milliseconds to the microsecond, everywhere a timing is reported


def token_times_ms(times: Iterable[float], started: float) -> list[float]:
    """Monotonic stamps (seconds) as milliseconds since ``started`` (a monotonic stamp too)."""
    return [round((t - started) * 1000, DECIMALS) for t in times]
