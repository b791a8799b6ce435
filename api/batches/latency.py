"""``GET /v1/batches/{id}/latency``: histograms of a batch's jobs' end-to-end latency and queue time, in
``/metrics``' buckets, the figures ``core.timings``'s."""

import bisect
from collections.abc import Callable, Iterable

from sqlalchemy import select

from api.batches.queries import find
from api.batches.schemas import BatchLatency, Histogram
from api.deps import Service
from api.http.caller import Caller
from api.http.metrics import LONG_BUCKETS
from core.models import Job
from core.states import TERMINAL, JobStatus
from core.timings import Stamped, e2e_latency_ms, queue_time_ms

BOUNDS_MS = [seconds * 1000 for seconds in LONG_BUCKETS]


def latency(service: Service, caller: Caller, batch_id: str) -> BatchLatency:
    columns = (Job.status, Job.queued_at, Job.started_at, Job.first_token_at, Job.finished_at)
    query = select(*columns).where(Job.batch_id == batch_id, Job.status.in_(TERMINAL))
    with service.sessions() as session:
        find(session, caller, batch_id)
        ended = session.execute(query).all()
    succeeded = [job for job in ended if job.status == JobStatus.SUCCEEDED]
    return BatchLatency(
        jobs=len(ended),
        e2e_latency=_histogram(succeeded, e2e_latency_ms),
        queue_time=_histogram(ended, queue_time_ms),
    )


def _histogram(jobs: Iterable[Stamped], figure: Callable[[Stamped], float | None]) -> Histogram:
    counts = [0] * (len(BOUNDS_MS) + 1)
    for job in jobs:
        if (value := figure(job)) is not None:
            counts[bisect.bisect_left(BOUNDS_MS, value)] += 1
    return Histogram(le_ms=BOUNDS_MS, counts=counts)
