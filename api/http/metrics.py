"""``GET /metrics``: job counts, queue depth and engine gauges read live at each scrape, and latency
histograms and counters (tokens and engine seconds by key name and model) of the jobs that finished since
this API process started.

The histograms are cumulative Prometheus histograms fed at scrape time: each scrape reads the jobs whose
``finished_at`` is at most ``LOOKBACK`` older than the previous scrape (a worker's row can commit a while
after the time it records, and its clock may differ a little from ours) and observes those not yet
observed; remembered ids are forgotten once they fall out of the window. Only new rows are read in full.
Queue time, time to first token and inter-token latency count every finished job that got that far;
end-to-end latency counts succeeded jobs only. The definitions, and figures, are ``core.timings``'s.
Every API process (``PAGEDQ_API_WORKERS``) observes every finished job from the database, so whichever
process answers a scrape, the histograms agree.
"""

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session, load_only, sessionmaker

from core.models import ApiKey, Job, Worker, utcnow
from core.queue import queue_depth, queue_name
from core.states import JobStatus
from core.timings import timings

logger = logging.getLogger(__name__)

LOOKBACK = timedelta(seconds=60)
LONG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)
ENGINE_GAUGES = {  # the worker's ``stats`` key → metric name, help
    "num_running": ("pagedq_engine_running_requests", "Requests the engine is running"),
    "num_waiting": ("pagedq_engine_waiting_requests", "Requests waiting in the engine's scheduler"),
    "kv_cache_usage": ("pagedq_engine_kv_cache_usage_ratio", "Fraction of KV cache blocks in use"),
    "tokens_per_s": ("pagedq_engine_generation_tokens_per_second", "Recent generation throughput"),
}


class Metrics:
    def __init__(
        self, sessions: sessionmaker[Session], celery: Celery, models: list[str], heartbeat_timeout: float
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(LiveCollector(sessions, celery, models, heartbeat_timeout))
        self._finished = FinishedJobs(sessions, self.registry)

    def render(self) -> bytes:
        self._finished.observe_new()
        return generate_latest(self.registry)


class FinishedJobs:
    """Feeds the latency histograms, each finished job exactly once."""

    def __init__(self, sessions: sessionmaker[Session], registry: CollectorRegistry) -> None:
        self._sessions = sessions
        self._started = utcnow()
        self._since = self._started
        self._seen: dict[str, datetime] = {}  # job id → finished_at, while inside the window
        self._lock = threading.Lock()
        self.queue_time = _histogram("queue_time", "Queued to claimed by a worker", LONG_BUCKETS, registry)
        self.ttft = _histogram("time_to_first_token", "Scheduled to first token", TTFT_BUCKETS, registry)
        self.itl = _histogram("inter_token_latency", "Between consecutive tokens", ITL_BUCKETS, registry)
        self.e2e = _histogram("e2e_latency", "Queued to succeeded", LONG_BUCKETS, registry)
        by_key = ["key", "model"]  # the key's name; "none" for jobs submitted without one (auth off)
        self.tokens = Counter(
            "pagedq_tokens", "Tokens of ended jobs", [*by_key, "kind"], registry=registry
        )  # kind: prompt, cached (of the prompt), completion
        self.engine_seconds = Counter(
            "pagedq_engine_seconds", "Engine time of ended jobs (usage.engine_ms)", by_key, registry=registry
        )

    def observe_new(self) -> None:
        with self._lock:
            now = utcnow()
            new = self._unseen_ids()
            jobs = self._load(new)
            names = self._key_names({job.key_id for job in jobs if job.key_id is not None})
            for job in jobs:
                self._observe(job)
                self._count(job, names.get(job.key_id, "none"))
                self._seen[job.id] = job.finished_at or now
            self._since = max(self._started, now - LOOKBACK)
            self._seen = {job_id: at for job_id, at in self._seen.items() if at >= self._since}

    def _unseen_ids(self) -> list[str]:
        with self._sessions() as session:
            ids = session.scalars(select(Job.id).where(Job.finished_at >= self._since))
            return [job_id for job_id in ids if job_id not in self._seen]

    def _load(self, job_ids: list[str]) -> Sequence[Job]:
        columns = (
            Job.status,
            Job.attempt,
            Job.queued_at,
            Job.started_at,
            Job.first_token_at,
            Job.finished_at,
            Job.key_id,
            Job.model,
            Job.prompt_tokens,
            Job.cached_tokens,
            Job.completion_tokens,
            Job.engine_ms,
        )
        with self._sessions() as session:
            query = select(Job).options(load_only(*columns)).where(Job.id.in_(job_ids))
            return session.scalars(query).all() if job_ids else []

    def _key_names(self, key_ids: set[str]) -> dict[str | None, str]:
        if not key_ids:
            return {}
        with self._sessions() as session:
            return dict(session.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.id.in_(key_ids))).all())

    def _count(self, job: Job, key: str) -> None:
        for kind, tokens in (
            ("prompt", job.prompt_tokens),
            ("cached", job.cached_tokens),
            ("completion", job.completion_tokens),
        ):
            self.tokens.labels(key, job.model, kind).inc(tokens)
        self.engine_seconds.labels(key, job.model).inc(job.engine_ms / 1000)

    def _observe(self, job: Job) -> None:
        figures = timings(job)
        for histogram, ms in (
            (self.queue_time, figures.queue_time_ms),
            (self.ttft, figures.time_to_first_token_ms),
            *((self.itl, gap) for gap in figures.inter_token_ms),
            (self.e2e, figures.e2e_latency_ms if job.status == JobStatus.SUCCEEDED else None),
        ):
            if ms is not None:
                histogram.observe(ms / 1000)


def _histogram(name: str, what: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> Histogram:
    return Histogram(f"pagedq_{name}_seconds", f"{what}, seconds", buckets=buckets, registry=registry)


def job_counts(session: Session, *where: ColumnElement[bool]) -> dict[JobStatus, int]:
    """Jobs (those ``where`` selects) by status, every status present (0 when none)."""
    counts = dict.fromkeys(JobStatus, 0)
    counts.update(session.execute(select(Job.status, func.count()).where(*where).group_by(Job.status)).all())
    return counts


@dataclass(frozen=True)
class LiveModel:
    workers: int  # with a recent heartbeat
    weights: dict[str, Any] | None  # the newest live worker's engine's (None: it published none)


def live_models(sessions: sessionmaker[Session], heartbeat_timeout: float) -> dict[str, LiveModel]:
    """The models with a live worker (absent: none), each with its newest live worker's weights."""
    query = select(Worker.model, Worker.weights).where(Worker.alive(heartbeat_timeout))
    with sessions() as session:
        rows = session.execute(query.order_by(Worker.started_at, Worker.id)).all()
    live: dict[str, LiveModel] = {}
    for model, weights in rows:  # oldest first: the newest's weights stay
        live[model] = LiveModel(live[model].workers + 1 if model in live else 1, weights)
    return live


def live_workers(session: Session, heartbeat_timeout: float) -> list[Worker]:
    return list(session.scalars(select(Worker).where(Worker.alive(heartbeat_timeout)).order_by(Worker.id)))


class LiveCollector(Collector):
    """Gauges read from the database and the broker at every scrape."""

    def __init__(
        self, sessions: sessionmaker[Session], celery: Celery, models: list[str], heartbeat_timeout: float
    ) -> None:
        self._sessions = sessions
        self._celery = celery
        self._models = models  # the served models' names: each has its queue
        self._heartbeat_timeout = heartbeat_timeout

    def collect(self) -> Iterator[Metric]:
        with self._sessions() as session:
            yield self._jobs(session)
            yield from self._engines(session)
        yield from self._queue_depth()

    def _jobs(self, session: Session) -> Metric:
        family = GaugeMetricFamily("pagedq_jobs", "Jobs by status", labels=["status"])
        for status, count in job_counts(session).items():
            family.add_metric([str(status)], count)
        return family

    def _engines(self, session: Session) -> Iterator[Metric]:
        workers = live_workers(session, self._heartbeat_timeout)
        live = GaugeMetricFamily("pagedq_workers", "Workers with a recent heartbeat", labels=["model"])
        for model in self._models:
            live.add_metric([model], sum(worker.model == model for worker in workers))
        yield live
        for key, (name, description) in ENGINE_GAUGES.items():
            family = GaugeMetricFamily(name, description, labels=["worker", "model"])
            for worker in workers:
                if isinstance(value := worker.stats.get(key), int | float):
                    family.add_metric([worker.id, worker.model], value)
            yield family

    def _queue_depth(self) -> Iterator[Metric]:
        """Each model's queue (what KEDA scales that model's workers on: docs/scale-out.md)."""
        family = GaugeMetricFamily(
            "pagedq_queue_depth", "Messages waiting in the broker", labels=["queue", "model"]
        )
        for model in self._models:
            queue = queue_name(model)
            try:
                family.add_metric([queue, model], queue_depth(self._celery, queue))
            except Exception as error:  # a scrape still reports the rest while the broker is down
                logger.warning("reading the depth of queue %s failed: %s", queue, error)
                return
        yield family
