"""The worker process: one engine, a Celery consumer of its model's queue, and the reconciler.

Celery runs with the threads pool: there is no fork, so CUDA is initialised once, in this process,
and every job in flight feeds the same engine.
"""

import logging
import os
import socket
import threading

from celery import Celery
from celery.exceptions import Reject
from celery.signals import worker_shutting_down

from core.db import make_engine, make_sessionmaker
from core.queue import RUN_JOB_TASK, make_celery, publish_job, queue_depth, queue_name
from core.settings import Settings
from core.streams import streams_url
from core.webhooks import Outbox
from worker.batches import BatchKeeper
from worker.engine import LLMEngine
from worker.host import EngineHost, RunResult
from worker.reconciler import Reconciler
from worker.store import JobStore
from worker.streamer import TokenStreamer

logger = logging.getLogger("pagedq.worker")


def register_run_job(app: Celery, host: EngineHost) -> None:
    @app.task(name=RUN_JOB_TASK)
    def run_job(job_id: str) -> None:
        if host.run(job_id) is RunResult.REFUSED:
            raise Reject("the worker is shutting down", requeue=True)


def run_worker(settings: Settings) -> None:
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    queue = queue_name(settings.served_model_name)
    app = make_celery(settings)

    def publish(job_id: str, priority: int) -> None:
        publish_job(app, job_id, queue, priority)

    outbox = Outbox(settings, app)  # job ends become webhook deliveries, published by the flusher thread
    store = JobStore(make_sessionmaker(make_engine(settings)), settings.served_model_name, outbox)
    url = streams_url(settings)
    streamer = TokenStreamer(url) if url else None
    host = EngineHost(
        lambda: LLMEngine(settings.engine_config()),
        store,
        publish,
        worker_id,
        settings.flush_interval,
        settings.heartbeat_period,
        streamer,
    )
    register_run_job(app, host)
    reconciler = Reconciler(
        store,
        publish,
        lambda: queue_depth(app, queue),
        settings.heartbeat_timeout,
        settings.requeue_after,
        BatchKeeper(store.sessions, outbox),
    )
    stop_reconciling = threading.Event()
    worker_shutting_down.connect(lambda **_: host.drain(settings.shutdown_grace), weak=False)
    host.start()
    threading.Thread(
        target=reconciler.run, args=(settings.reconcile_interval, stop_reconciling), daemon=True
    ).start()
    logger.info("worker ready", extra={"worker_id": worker_id, "queue": queue})
    try:
        app.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={settings.jobs_held_per_worker}",
                f"--queues={queue}",
                f"--hostname=pagedq-{os.getpid()}@%h",
                f"--loglevel={settings.log_level}",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",  # Celery's event heartbeats: the workers table is pagedq's liveness
            ]
        )
    finally:
        stop_reconciling.set()
        host.stop()
        if streamer is not None:
            streamer.close()
        logger.info("worker stopped", extra={"worker_id": worker_id})
