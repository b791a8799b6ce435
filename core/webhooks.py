"""Webhook events: which endpoints hear of an event, the payload they get, and the outbox rows.

``record_event`` runs inside the transaction that changes the job's or batch's state, so an event is
recorded exactly when its cause is committed; the caller publishes the returned delivery ids after the
commit (a lost publish is repaired by the sender's sweeper). Payloads are shaped like OpenAI's webhook
events (``{"object": "event", "id", "type", "created_at", "data": {"id", ...}}``).
"""

import ipaddress
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal, get_args

from celery import Celery
from pydantic import HttpUrl, TypeAdapter, ValidationError
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from core.models import Batch, Job, WebhookDelivery, new_delivery_id, time_ordered_id
from core.queue import DELIVER_WEBHOOK_TASK
from core.settings import Settings
from core.special_addresses import Address, special_range
from core.states import JobStatus

logger = logging.getLogger(__name__)

JobEvent = Literal["job.succeeded", "job.failed", "job.cancelled"]
BatchEvent = Literal["batch.completed", "batch.failed", "batch.cancelled", "batch.expired", "batch.at_risk"]
JOB_EVENTS: frozenset[str] = frozenset(get_args(JobEvent))
BATCH_EVENTS: frozenset[str] = frozenset(get_args(BatchEvent))


def record_event(
    session: Session,
    settings: Settings,
    event_type: str,
    *,
    job: Job | None = None,
    batch: Batch | None = None,
) -> list[str]:
    """Add one delivery per endpoint that hears of this event; returns their ids, to publish after commit.

    The endpoints: the job's or batch's own ``webhook_url`` if its ``webhook_events`` include the event
    (None: every event of its kind), and the global ``settings.webhook_url``. The jobs of a batch are
    announced by their batch's events alone: a 50,000-line batch must not send 50,000 job events.
    """
    target = _target(event_type, job, batch)
    if job is not None and job.batch_id is not None:
        return []
    urls = [settings.webhook_url] if settings.webhook_url else []
    if target.webhook_url and (target.webhook_events is None or event_type in target.webhook_events):
        urls.insert(0, target.webhook_url)
    if not urls:
        return []
    payload = {
        "object": "event",
        "id": time_ordered_id("evt_"),
        "type": event_type,
        "created_at": int(time.time()),
        "data": _job_data(job) if job is not None else _batch_data(session, target),
    }
    deliveries = [
        WebhookDelivery(
            id=new_delivery_id(),
            event_type=event_type,
            url=url,
            payload=payload,
            job_id=job.id if job is not None else None,
            batch_id=batch.id if job is None and batch is not None else None,
        )
        for url in dict.fromkeys(urls)  # the same URL twice gets the event once
    ]
    session.add_all(deliveries)
    return [delivery.id for delivery in deliveries]


def _target(event_type: str, job: Job | None, batch: Batch | None) -> Job | Batch:
    if event_type in JOB_EVENTS and job is not None:
        return job
    if event_type in BATCH_EVENTS and batch is not None and job is None:
        return batch
    raise ValueError(
        f"event {event_type!r} needs a job (one of {sorted(JOB_EVENTS)}) or a batch "
        f"(one of {sorted(BATCH_EVENTS)}), got job={job is not None}, batch={batch is not None}"
    )


def _job_data(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "object": "job",
        "status": job.status,
        "model": job.model,
        "output": job.output_text,
        "finish_reason": job.finish_reason,
        "error": job.error,
        "usage": {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.completion_tokens,
            "cached_tokens": job.cached_tokens,
            "total_tokens": job.prompt_tokens + job.completion_tokens,
        },
        "metadata": job.meta,
        "batch_id": job.batch_id,
        "custom_id": job.custom_id,
    }


def _batch_data(session: Session, batch: Batch) -> dict[str, Any]:
    counts = dict(
        session.execute(
            select(Job.status, func.count()).where(Job.batch_id == batch.id).group_by(Job.status)
        ).all()
    )
    completed = counts.get(JobStatus.SUCCEEDED, 0)
    return {
        "id": batch.id,
        "object": "batch",
        "status": batch.status,
        "endpoint": batch.endpoint,
        "model": batch.model,
        "input_file_id": batch.input_file_id,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "request_counts": {
            "total": batch.total,
            "completed": completed,
            "failed": counts.get(JobStatus.FAILED, 0) + counts.get(JobStatus.CANCELLED, 0),
        },
        "metadata": batch.meta,
    }


def publish_deliveries(celery: Celery, delivery_ids: list[str]) -> None:
    """Hand committed deliveries to the sender; a failure is logged: the sweeper republishes them."""
    for delivery_id in delivery_ids:
        try:
            celery.send_task(DELIVER_WEBHOOK_TASK, args=[delivery_id])  # routed to webhook_queue
        except Exception as error:
            logger.warning(
                "publishing a webhook delivery failed; the sweeper will republish it",
                extra={"delivery_id": delivery_id, "error": repr(error)},
            )


@dataclass(frozen=True)
class Outbox:
    """``record_event`` and ``publish_deliveries`` bound to one process's settings and Celery app."""

    settings: Settings
    celery: Celery

    def record(
        self, session: Session, event_type: str, *, job: Job | None = None, batch: Batch | None = None
    ) -> list[str]:
        return record_event(session, self.settings, event_type, job=job, batch=batch)

    def jobs_heard(self) -> tuple[ColumnElement[bool], ...]:
        """Where-clauses of the jobs whose events some endpoint may hear (``record_event``'s rule): not a
        batch's lines, and without a global endpoint only jobs with a URL of their own. A writer that ends
        jobs loads only those: a batch's step ends a few lines each time."""
        heard = Job.batch_id.is_(None)
        return (heard,) if self.settings.webhook_url else (heard, Job.webhook_url.is_not(None))

    def publish(self, delivery_ids: list[str]) -> None:
        publish_deliveries(self.celery, delivery_ids)


class WebhookRefused(ValueError):
    """A webhook URL that may not be used: not http(s), or its host is in a special-purpose range."""


_URL = TypeAdapter(HttpUrl)


def parse_webhook_url(url: str) -> HttpUrl:
    """The one parser of a webhook URL (WHATWG's rules, as the API validates it): the guard checks the
    host it reads and the sender connects to that same host, so no two parsers can disagree on it."""
    try:
        parsed = _URL.validate_python(url)
    except ValidationError:
        raise WebhookRefused("webhook URL must be http:// or https:// with a host") from None
    if parsed.host is None:
        raise WebhookRefused("webhook URL must be http:// or https:// with a host")
    return parsed


def checked_address(url: str, allow_private: bool, resolve_timeout: float) -> Address:
    """Resolve ``url``'s host once and check every address it has; the sender connects to the one returned.

    Raises ``WebhookRefused`` for a URL that is not http(s) with a host and (unless ``allow_private``) a
    host that is, or resolves to, an address in a special-purpose range (``core/special_addresses.py``);
    ``OSError`` when the host does not resolve within ``resolve_timeout`` seconds.
    """
    parsed = parse_webhook_url(url)
    host = bare_host(parsed)
    addresses = resolve(host, parsed.port or 0, resolve_timeout)
    for address in [] if allow_private else addresses:
        if special := special_range(address):
            raise WebhookRefused(
                f"webhook URL host {host!r} is or resolves to an address in a special-purpose "
                f"range: {special}; webhooks go only to public addresses unless "
                "PAGEDQ_WEBHOOK_ALLOW_PRIVATE=true"
            )
    return addresses[0]


def bare_host(url: HttpUrl) -> str:
    """The host without an IPv6 literal's brackets: what a resolver or a TLS server name takes."""
    return (url.host or "").strip("[]")


_resolver = ThreadPoolExecutor(8, thread_name_prefix="webhook-resolve")


def resolve(host: str, port: int, timeout: float) -> list[Address]:
    """The addresses of ``host`` (itself, for an IP literal), from ``getaddrinfo`` in a thread of its
    own so that a slow DNS server holds the caller ``timeout`` seconds at most."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    lookup = _resolver.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        infos = lookup.result(timeout)
    except FutureTimeout:
        lookup.cancel()
        raise TimeoutError(f"no answer within {timeout:g} s") from None
    if not infos:
        raise socket.gaierror(f"{host!r} has no address")
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
