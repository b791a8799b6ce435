"""Live token streams: the worker appends each job's new text to a Redis stream; the API follows it.

A Redis stream (not plain pub/sub) keeps what was produced so far, so a client that connects late
reads it from the start before it blocks for more. Each entry carries the run's ``attempt``: a job
requeued after a fault starts over, and the reader says so. Without Redis (``pagedq up``) there is no
stream and the API follows the job row's partial output instead.
"""

from core.settings import Settings

STREAM_TTL_S = 3600  # a finished job's stream is kept this long for late readers


def stream_key(job_id: str) -> str:
    return f"pagedq:stream:{job_id}"


def streams_url(settings: Settings) -> str | None:
    url = settings.resolved_broker_url
    return url if url.startswith(("redis://", "rediss://")) else None
