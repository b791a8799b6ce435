"""The Celery app both sides build from settings, and how a job id travels through it.

The API publishes by task name (it never imports the worker); messages carry the job id only, and the
job row is always committed before its message is published.
"""

import re
from pathlib import Path
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename
from kombu.entity import PERSISTENT_DELIVERY_MODE
from kombu.utils.uuid import uuid

from core import file_broker, redis_broker
from core.settings import Settings

RUN_JOB_TASK = "pagedq.run_job"
PROBE_QUEUE_TASK = "pagedq.probe_queue"  # a marker behind one priority step's messages (worker/reconciler.py)
DELIVER_WEBHOOK_TASK = "pagedq.deliver_webhook"  # routed to settings.webhook_queue, `pagedq webhooks`
CELERY_PRIORITIES = 10  # Redis priority steps 0 (first) .. 9


def queue_name(served_model: str) -> str:
    """A worker serves one model and consumes that model's queue."""
    return "pagedq.jobs." + re.sub(r"[^A-Za-z0-9_.-]", "_", served_model)


def celery_priority(job_priority: int) -> int:
    """Job priority -100 (first) .. 100 onto the broker's 0 (first) .. 9."""
    clamped = min(max(job_priority, -100), 100)
    return (clamped + 100) * (CELERY_PRIORITIES - 1) // 200


def priorities_at(step: int) -> tuple[int, int]:
    """The job priorities (lowest, highest) whose messages travel at broker priority ``step``."""
    members = [p for p in range(-100, 101) if celery_priority(p) == step]
    lowest = -(2**31) if step == 0 else min(members)  # priorities beyond ±100 are clamped onto the ends
    return lowest, 2**31 - 1 if step == CELERY_PRIORITIES - 1 else max(members)


def make_celery(settings: Settings) -> Celery:
    app = Celery("pagedq", set_as_current=False)
    app.conf.update(_reliability_conf(settings), **_broker_conf(settings))
    app.conf.task_default_queue = queue_name(settings.served_model_name)
    app.conf.task_routes = {DELIVER_WEBHOOK_TASK: {"queue": settings.webhook_queue}}
    return app


def _reliability_conf(settings: Settings) -> dict[str, Any]:
    return {
        # A message is acknowledged only after the job's result is committed, and a worker that dies
        # mid-job gives its messages back; the job row (its attempt) makes a second run harmless.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One worker holds only as many jobs as its engine has seats (worker_concurrency threads),
        # so it never hoards jobs that another worker could start.
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,  # results live in the jobs table
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_default_priority": celery_priority(0),
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
    }


def _broker_conf(settings: Settings) -> dict[str, Any]:
    url = settings.resolved_broker_url
    if settings.broker_kind == "filesystem":
        folder = Path(url.removeprefix("filesystem://"))
        for sub in ("queue", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"),
            "polling_interval": 0.05,
        }
        # Messages are files that survive a restart, each written whole (core/file_broker.py); remote
        # control needs a real broker. A host in the URL, so that kombu does not warn of its absence.
        return {
            "broker_url": f"{file_broker.SCHEME}://localhost/",
            "broker_transport_options": options,
            "worker_enable_remote_control": False,
        }
    options = {
        # A message leaves Redis as a worker receives it. The database says which jobs wait, and repairs a
        # message that a killed worker held: its queued job is republished, its running one requeued
        # (worker/reconciler.py), a webhook delivery republished by the sender's sweeper. kombu's own
        # keeping of unacknowledged messages in Redis cost every message a transaction as it was received
        # and another as it was acknowledged (~0.5 ms of its delivery: bench/RESULTS.md, 2026-11-29), to
        # hand it back an hour later.
        "ack_emulation": False,
        "queue_order_strategy": "priority",
        "priority_steps": list(range(CELERY_PRIORITIES)),
        "sep": ":",
    }
    conf = {"broker_url": url, "broker_transport_options": options}
    if url.split("://", 1)[0] == redis_broker.SCHEME:
        conf["broker_transport"] = redis_broker.TRANSPORT
    return conf


def publish_probe(app: Celery, queue: str, step: int, published_before: str) -> None:
    """A probe behind ``step``'s messages: when it is consumed, every job message of that step published
    before ``published_before`` (ISO time) has been consumed too; a job among them still queued lost its."""
    app.send_task(PROBE_QUEUE_TASK, args=[step, published_before], queue=queue, priority=step)


def publish_jobs(app: Celery, job_ids: list[str], queue: str, priority: int) -> None:
    """Many ids through one producer; on Redis in pipelines (one round trip per thousand messages).

    Each message is Celery's own (``create_task_message``), published straight to its queue's list (the
    default exchange, as ``send_task`` does for a direct queue), without what ``send_task`` repeats per
    message for a job id: routing, a declaration of the queue and a safe repr of the arguments. That was
    ~0.85 ms of the ~2 ms of API CPU an accepted job cost (bench/RESULTS.md, 2026-11-27)."""
    rank, conf, origin = celery_priority(priority), app.conf, anon_nodename()
    with app.producer_or_acquire() as producer, producer.batch():
        for job_id in job_ids:
            task_id = uuid()
            headers, properties, body, _ = app.amqp.create_task_message(
                task_id, RUN_JOB_TASK, [job_id], {}, argsrepr=repr([job_id]), kwargsrepr="{}", origin=origin
            )
            producer.publish(
                body,
                exchange="",
                routing_key=queue,
                priority=rank,
                headers=headers,
                serializer=conf.task_serializer,
                delivery_mode=PERSISTENT_DELIVERY_MODE,
                retry=conf.task_publish_retry,
                retry_policy=conf.task_publish_retry_policy,
                **properties,
            )


def queue_depth(app: Celery, queue: str) -> int:
    """Messages waiting in the broker for ``queue`` (not those a worker already holds)."""
    with app.pool.acquire(block=True) as conn:  # a pooled connection: this runs every reconcile round
        try:
            return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
        except conn.channel_errors:
            return 0  # the queue does not exist yet
