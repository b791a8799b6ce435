"""The worker process: one engine, a Celery consumer of its model's queue, and the reconciler.

Celery runs with the threads pool: there is no fork, so CUDA is initialised once, in this process,
and every job in flight feeds the same engine.
"""

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery import Celery
from celery.exceptions import Reject
from celery.signals import worker_init, worker_ready, worker_shutting_down
from celery.worker import WorkController

from contract.engine import EngineConfig
from contract.heap import freeze_startup_heap
from core.purge import Purger
from core.queue import PROBE_QUEUE_TASK, RUN_JOB_TASK, make_celery, publish_jobs, publish_probe, queue_name
from core.served_models import ModelEntry, default_model, model_named
from core.settings import Settings
from core.streams import end_announcer, stream_dropper, streams_url
from core.webhooks import Outbox
from worker.batches import BatchKeeper
from worker.claimer import Claimer, RunResult
from worker.connections import WorkerConnections, warn_without_autovacuum
from worker.connectivity import Connectivity
from worker.drain import Drain
from worker.embedding_host import embedding
from worker.engine import LLMEngine
from worker.engine.identity import served_by
from worker.engine.model_runner import resolve_device
from worker.engine_loop import EngineLoop
from worker.flights import Flights
from worker.flusher import Flusher, Publish
from worker.health import WorkerHealth
from worker.heartbeat import Heartbeat
from worker.host import EngineHost, EngineKind
from worker.liveness import new_worker_id
from worker.os_threads import name_this_thread, set_bookkeeping_nice
from worker.reconciler import Reconciler
from worker.results import JobResult
from worker.store import JobStore
from worker.streamer import TokenStreamer

logger = logging.getLogger("pagedq.worker")


def register_run_job(app: Celery, host: EngineHost) -> None:
    @app.task(name=RUN_JOB_TASK)
    def run_job(job_id: str) -> None:
        name_this_thread("pagedq-seat")  # a Celery pool thread (bench/service_cpu.py counts them apart)
        result = host.run(job_id)
        if result is RunResult.REFUSED:
            raise Reject("the worker is shutting down", requeue=True)
        if result is RunResult.UNWRITTEN:  # never acknowledge a message whose result was not written
            raise Reject("shut down before the job's result could be written", requeue=True)


def register_probe_queue(app: Celery, reconciler: Reconciler, turns: threading.Semaphore) -> None:
    @app.task(name=PROBE_QUEUE_TASK)
    def probe_queue(step: int, published_before: str) -> None:
        with turns:  # a pool thread: it takes a turn on the database, as claims do
            reconciler.republish_lost(step, datetime.fromisoformat(published_before))


def engine_facts(engine: LLMEngine) -> dict[str, Any]:
    """What a person starting the service wants to see: where the model runs, on which kernels, its
    weights (types, bytes, the kernels that multiply them), and how much KV it holds."""
    runner = engine.runner
    return {
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "kernels": runner.kernel_backend,
        "kv_cache_blocks": runner.num_blocks,
        "kv_cache_bytes": runner.kv_cache_bytes,
        "max_model_len": engine.max_model_len,
        "weights": runner.weights.as_json(),
    }


def first_token_yield(settings: Settings, engine_config: EngineConfig) -> float:
    """Seconds the engine waits after a step that opens a reader's stream: on a CPU only, where its next
    step would take the cores the token's relay needs (a GPU's step leaves them free)."""
    on_cpu = resolve_device(engine_config.device).type == "cpu"
    return settings.first_token_yield_ms / 1000 if on_cpu else 0.0


def served_entry(settings: Settings, model: str | None) -> ModelEntry:
    """The served model a worker runs: ``--model``'s, else the default (the first generate model)."""
    return model_named(settings, model) if model else default_model(settings)


def run_worker(settings: Settings, ready_fd: int | None = None, model: str | None = None) -> int:
    """Serves one model's queue until a signal (``model``: its served name; None: the first generate
    model); once it consumes, says so in a log record and, with ``ready_fd`` (``pagedq up``), as one JSON
    line on that file descriptor. Returns Celery's exit status (not 0: its consumer failed). Raises
    ``ModelsError`` for a model that is not served here."""
    entry = served_entry(settings, model)
    return serve(settings, entry, embedding if entry.kind == "embed" else generation, ready_fd)


def generation(engine_config: EngineConfig) -> EngineKind:
    """A worker of a chat model: an ``LLMEngine`` of ``engine_config``."""
    build = lambda: LLMEngine(engine_config)  # noqa: E731
    return EngineKind(
        lambda flights, streamer: EngineLoop(build, flights, streamer),
        JobResult.claimed,
        engine_facts,
        identity=served_by,
    )


def serve(
    settings: Settings, entry: ModelEntry, kind_of: Callable[[EngineConfig], EngineKind], ready_fd: int | None
) -> int:
    """Serves the queue of the model ``entry`` with an engine of its kind until a signal (``run_worker``)."""
    worker_id = new_worker_id()
    set_bookkeeping_nice(settings.bookkeeping_nice)
    engine_config = entry.engine_config(settings.engine_config())
    kind = kind_of(engine_config)
    queue = queue_name(entry.name)
    app = make_celery(settings)

    def publish(job_id: str, priority: int) -> None:
        publish_jobs(app, [job_id], queue, priority)

    outbox = Outbox(settings, app)  # job ends become webhook deliveries, published by the flusher thread
    connections = WorkerConnections.connect(settings)
    warn_without_autovacuum(connections.jobs)
    fair_aging = settings.fair_aging_seconds if settings.fair_share else None
    store = JobStore(
        connections.job_sessions,
        entry.name,
        outbox,
        settings.max_attempts,
        fair_aging,
        prefix_aware=settings.prefix_aware_order,
    )
    url = streams_url(settings) if kind.streams else None
    streamer = TokenStreamer(url, first_token_yield(settings, engine_config)) if url else None
    health = WorkerHealth(settings.resolved_worker_status_file, settings.heartbeat_period, worker_id)
    heartbeats = JobStore(connections.heartbeat_sessions, entry.name)
    host = engine_host(
        settings,
        engine_config,
        store,
        heartbeats,
        publish,
        worker_id,
        health,
        streamer,
        connections.turns,
        kind,
    )
    register_run_job(app, host)
    reconciler = Reconciler(
        store,
        publish,
        lambda step, before: publish_probe(app, queue, step, before.isoformat()),
        settings.heartbeat_timeout,
        settings.requeue_after,
        BatchKeeper(store.sessions, outbox),
        Purger(store.sessions, settings.purge_chunk, stream_dropper(settings)),
        settings.purge_interval,
        host.connectivity,
        wake=host.flusher.batch_jobs_ended,
    )
    register_probe_queue(app, reconciler, connections.turns)
    facts = {"worker_id": worker_id, "model": entry.name, "kind": entry.kind, "queue": queue}
    handle_signals(host, settings, facts, ready_fd, kind.facts)
    host.start()
    if kind.identity is not None:  # before Celery consumes: every claim records it
        store.served_by = kind.identity(host.loop.engine)
    stop_reconciling = threading.Event()
    threading.Thread(
        target=reconciler.run, args=(settings.reconcile_interval, stop_reconciling), daemon=True
    ).start()
    try:
        return consume(app, settings, queue, settings.worker_concurrency or engine_config.max_num_seqs)
    finally:
        stop_reconciling.set()
        reconciler.wake.set()
        host.stop()
        if streamer is not None:
            streamer.close()
        connections.dispose()
        logger.info("worker stopped", extra={"worker_id": worker_id})


def engine_host(
    settings: Settings,
    engine_config: EngineConfig,
    store: JobStore,
    heartbeats: JobStore,
    publish: Publish,
    worker_id: str,
    health: WorkerHealth,
    streamer: TokenStreamer | None,
    turns: threading.Semaphore,
    kind: EngineKind | None = None,
) -> EngineHost:
    """The claimer, the engine loop and the flusher around one registry, and the heartbeat
    (worker/host.py), for an engine of ``engine_config`` of ``kind`` (default: generation);
    ``heartbeats`` is a store on the heartbeat's own engine (worker/connections.py)."""
    kind = kind or generation(engine_config)
    flights, connectivity = Flights(), Connectivity()
    loop = kind.make_loop(flights, streamer)
    # Past the drain deadline, failed writes are retried until other workers would take over our jobs.
    drain = Drain(write_grace=settings.heartbeat_timeout)
    flusher = Flusher(
        flights,
        store,
        drain,
        health,
        worker_id,
        settings.flush_interval,
        settings.heartbeat_period,
        publish,
        abort=loop.abort,
        connectivity=connectivity,
        announce_ended=end_announcer(settings),
        lines_interval=settings.batch_flush_period,
    )
    period = settings.heartbeat_period
    store.held_prefixes = loop.held_prefixes  # the claim prefers them; the heartbeat publishes them
    heartbeat = Heartbeat(
        heartbeats,
        worker_id,
        period,
        loop.stats,
        flusher.writes_work,
        connectivity,
        loop.held_prefixes,
        lambda: kind.facts(loop.engine).get("weights"),
    )
    claimer = Claimer(flights, store, worker_id, drain, loop.add, flusher.backoff, turns, kind.result_of)
    return EngineHost(claimer, loop, flusher, heartbeat, health)


def handle_signals(
    host: EngineHost,
    settings: Settings,
    facts: dict[str, Any],
    ready_fd: int | None,
    engine_facts: Callable[[Any], dict[str, Any]] = engine_facts,
) -> None:
    now, interrupted, shutting_down = threading.Event(), threading.Event(), threading.Event()

    def drain(**_: object) -> None:  # Celery's warm shutdown: SIGTERM, or our first Ctrl-C
        shutting_down.set()
        host.drain(0.0 if now.is_set() else settings.shutdown_grace)

    def stop_now(*_: object) -> None:  # SIGUSR2: requeue what still runs at once (`pagedq up`'s 2nd Ctrl-C)
        now.set()
        host.drain(0.0)
        if not shutting_down.is_set():  # stop consuming; a second SIGTERM mid-shutdown once hung the worker
            signal.raise_signal(signal.SIGTERM)

    def interrupt(*_: object) -> None:  # a standalone worker's Ctrl-C: drain, and on a second, stop now
        if interrupted.is_set():
            stop_now()
            return
        interrupted.set()
        logger.info("interrupted: Ctrl-C again requeues the running jobs at once")
        signal.raise_signal(signal.SIGTERM)

    def ready(**_: object) -> None:
        freeze_startup_heap()  # a full collection of torch's heap would stall the engine's steps
        announced = facts | engine_facts(host.loop.engine)
        logger.info("worker ready", extra=announced)
        # Ctrl-C is ours, not Celery's: Celery takes a second one for a cold shutdown, which its threads
        # pool cannot do (it logs a NotImplementedError and leaves the jobs running). Under `pagedq up`,
        # `up` owns it: it stops the API, then sends SIGTERM, then SIGUSR2 for "now".
        signal.signal(signal.SIGINT, signal.SIG_IGN if ready_fd is not None else interrupt)
        if ready_fd is not None:
            with os.fdopen(ready_fd, "w") as announce:
                announce.write(json.dumps(announced) + "\n")

    worker_shutting_down.connect(drain, weak=False)
    signal.signal(signal.SIGUSR2, stop_now)
    worker_ready.connect(ready, weak=False)


def consume(app: Celery, settings: Settings, queue: str, concurrency: int) -> int:
    """Consumes until a signal or a failure of Celery's own; returns the Celery worker's exit status,
    which ``worker_main`` drops (a worker whose consumer died exited 0, taken for one that drained)."""
    controllers: list[WorkController] = []
    worker_init.connect(lambda sender, **_: controllers.append(sender), weak=False)
    app.worker_main(
        [
            "--quiet",  # no banner: the "worker ready" record says what matters
            "worker",
            "--pool=threads",
            f"--concurrency={concurrency}",  # jobs held at once
            f"--queues={queue}",
            f"--hostname=pagedq-{os.getpid()}@%h",
            f"--loglevel={settings.log_level}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",  # Celery's event heartbeats: the workers table is pagedq's liveness
        ]
    )
    return int(controllers[-1].exitcode or 0) if controllers else 1
