"""``pagedq webhooks``: sends the webhook outbox, signed per Standard Webhooks, retried with backoff.

A Celery task per attempt, on its own queue and process (threads pool), so a slow endpoint never holds
an engine. Each attempt claims its delivery (pending and due → leased), posts, then records the attempt
and the next state on the condition that it still holds the claim: a duplicate message finds the row
leased or done and sends nothing. Retries are the same task re-published with an ETA; a sweeper
republishes pending deliveries whose message was lost (a failed publish, a crash mid-attempt).
"""

import base64
import hashlib
import hmac
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from celery import Celery
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from core.db import make_db_engine, make_sessionmaker
from core.models import WebhookDelivery, utcnow
from core.queue import DELIVER_WEBHOOK_TASK, make_celery
from core.settings import Settings
from core.webhooks import WebhookRefused, bare_host, checked_address, parse_webhook_url, publish_deliveries

logger = logging.getLogger("pagedq.webhooks")

MAX_DELAY = 3600.0  # the longest wait between attempts, Retry-After included
THREADS = 16  # deliveries in flight at once
SWEEP_BATCH = 500
SECRET_PREFIX = "whsec_"


# --- signing ---


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """Standard Webhooks' ``webhook-signature``: v1, base64 HMAC-SHA256 of ``id.timestamp.body``."""
    digest = hmac.new(secret_key(secret), f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def secret_key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret is {SECRET_PREFIX} followed by base64, got {secret[:6]!r}…")
    try:
        encoded = secret.removeprefix(SECRET_PREFIX)
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except ValueError as error:
        raise ValueError(f"the webhook secret after {SECRET_PREFIX} is not valid base64: {error}") from error
    if not key:
        raise ValueError("the webhook secret is empty")
    return key


def load_secret(settings: Settings) -> str:
    """``PAGEDQ_WEBHOOK_SECRET``, or one generated once into ``<data_dir>/webhook_secret`` (mode 0600)."""
    if settings.webhook_secret:
        secret_key(settings.webhook_secret)
        logger.info("webhook secret from PAGEDQ_WEBHOOK_SECRET")
        return settings.webhook_secret
    path = settings.data_dir / "webhook_secret"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".webhook_secret.{os.getpid()}")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode() + "\n")
        try:
            os.link(draft, path)  # atomic: of two processes starting together, one secret wins
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    secret = path.read_text().strip()
    secret_key(secret)
    logger.info(
        "webhook secret from file (set PAGEDQ_WEBHOOK_SECRET to choose one)", extra={"path": str(path)}
    )
    return secret


# --- one attempt and what follows it ---


@dataclass(frozen=True)
class Attempt:
    at: datetime
    status_code: int | None = None
    latency_ms: float = 0.0
    error: str | None = None
    transient: bool = False  # a network error or timeout: worth retrying
    retry_after: float | None = None  # seconds the endpoint asked for (Retry-After)

    def record(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "status_code": self.status_code,
            "latency_ms": round(self.latency_ms, 1),
            "error": self.error,
        }


def transport_error_class(error: httpx.TransportError) -> str:
    """A network failure's generic class; its message (addresses, the peer's words) stays out of records."""
    if isinstance(error, httpx.TimeoutException):
        return "timeout"
    return "connect error" if isinstance(error, httpx.ConnectError) else "network error"


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A ``Retry-After`` header, in seconds or as an HTTP date; None when absent or unreadable."""
    if not value or not value.strip():
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when.replace(tzinfo=when.tzinfo or UTC) - now).total_seconds())


def backoff(number: int, base: float) -> float:
    """Before retry ``number``: base × 1, 2, 4 … capped at MAX_DELAY, less up to a quarter at random."""
    return min(base * 2 ** (number - 1), MAX_DELAY) * random.uniform(0.75, 1.0)


def next_step(attempt: Attempt, number: int, settings: Settings) -> tuple[str, float | None]:
    """The delivery's status after its attempt ``number``, and the seconds until the next (None: no more).

    2xx: delivered. Timeouts, connection errors, 429 and 5xx: retried (Retry-After honoured) until
    ``webhook_max_attempts``. 410 (the endpoint is gone), other 4xx and refused URLs: failed at once.
    """
    code = attempt.status_code
    if code is not None and 200 <= code < 300:
        return "delivered", None
    retryable = attempt.transient if code is None else code == 429 or code >= 500
    if not retryable or number >= settings.webhook_max_attempts:
        return "failed", None
    if attempt.retry_after is not None:
        return "pending", min(attempt.retry_after, MAX_DELAY)
    return "pending", backoff(number, settings.webhook_backoff_base)


@dataclass(frozen=True)
class Claim:
    id: str
    url: str
    payload: dict[str, Any]
    attempts: list[dict[str, Any]]
    lease_until: datetime  # the claim's token: the row's next_attempt_at while this attempt holds it


class Sender:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        settings: Settings,
        secret: str,
        retry: Callable[[str, datetime], None],
    ) -> None:
        self.sessions, self.settings, self.secret, self.retry = sessions, settings, secret, retry
        # Redirects are not followed (they could lead to a private address); proxies are not used.
        # Connections are not kept: one to a pinned address must not carry another host's request.
        self.client = httpx.Client(
            timeout=settings.webhook_timeout,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self.lease = timedelta(seconds=4 * settings.webhook_timeout + 10)  # connect, write, read, pool

    def close(self) -> None:
        self.client.close()

    def deliver(self, delivery_id: str) -> None:
        """One attempt, if the delivery is pending and due; then its record, and a retry if one is due."""
        claim = self._claim(delivery_id)
        if claim is None:
            logger.info(
                "webhook delivery not due or already done; skipping", extra={"delivery_id": delivery_id}
            )
            return
        attempt = self._attempt(claim)
        number = len(claim.attempts) + 1
        status, delay = next_step(attempt, number, self.settings)
        next_at = utcnow() + timedelta(seconds=delay) if delay is not None else None
        if not self._record(claim, attempt, status, next_at):
            logger.warning("webhook delivery claim expired mid-attempt", extra={"delivery_id": delivery_id})
            return
        extra = {"delivery_id": delivery_id, "attempt": number, "status": status, **attempt.record()}
        extra["next_attempt_at"] = next_at.isoformat() if next_at else None
        (logger.info if status == "delivered" else logger.warning)("webhook attempt", extra=extra)
        if next_at is not None:
            self.retry(delivery_id, next_at)

    def _claim(self, delivery_id: str) -> Claim | None:
        now = utcnow()
        lease_until = now + self.lease
        statement = (
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= now,
            )
            .values(next_attempt_at=lease_until)
            .returning(WebhookDelivery.url, WebhookDelivery.payload, WebhookDelivery.attempts)
        )
        with self.sessions.begin() as session:
            row = session.execute(statement).one_or_none()
        return None if row is None else Claim(delivery_id, row.url, row.payload, row.attempts, lease_until)

    def _record(self, claim: Claim, attempt: Attempt, status: str, next_at: datetime | None) -> bool:
        statement = (
            update(WebhookDelivery)
            .where(
                WebhookDelivery.id == claim.id,
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at == claim.lease_until,
            )
            .values(status=status, attempts=[*claim.attempts, attempt.record()], next_attempt_at=next_at)
        )
        with self.sessions.begin() as session:
            return session.execute(statement).rowcount == 1

    def _attempt(self, claim: Claim) -> Attempt:
        """POST to the one address the URL's host was resolved to and checked against, never a second
        lookup's (DNS rebinding); the Host header, TLS server name and certificate check stay the host's.

        What is recorded is the status code, the latency and a generic error class, never the endpoint's
        words (its body or reason phrase) or what a refused host resolves to.
        """
        at = utcnow()
        try:
            address = checked_address(
                claim.url, self.settings.webhook_allow_private, self.settings.webhook_resolve_timeout
            )
        except WebhookRefused as refused:
            logger.warning("webhook URL refused", extra={"delivery_id": claim.id, "reason": str(refused)})
            return Attempt(at, error="refused")
        except OSError as error:
            logger.warning(
                "webhook host does not resolve", extra={"delivery_id": claim.id, "error": repr(error)}
            )
            return Attempt(at, error="unresolvable", transient=True)
        url = parse_webhook_url(claim.url)  # the guard's own parse: the host checked is the host reached
        body = json.dumps(claim.payload, separators=(",", ":"), ensure_ascii=False)
        timestamp = int(time.time())
        default_port = 443 if url.scheme == "https" else 80
        headers = {
            "host": url.host if url.port == default_port else f"{url.host}:{url.port}",
            "content-type": "application/json",
            "user-agent": "pagedq-webhooks",
            "webhook-id": claim.id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self.secret, claim.id, timestamp, body),
        }
        tls = {"sni_hostname": bare_host(url)} if url.scheme == "https" else {}
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        pinned = httpx.URL(scheme=url.scheme, host=str(address), port=url.port, raw_path=target.encode())
        start = time.monotonic()
        try:
            with self.client.stream(
                "POST", pinned, content=body.encode(), headers=headers, extensions=tls
            ) as response:
                code = response.status_code
                wait = retry_after_seconds(response.headers.get("retry-after"), utcnow())
        except httpx.TransportError as error:  # timeouts, refused connections, broken responses
            latency = (time.monotonic() - start) * 1000
            return Attempt(at, latency_ms=latency, error=transport_error_class(error), transient=True)
        latency = (time.monotonic() - start) * 1000
        return Attempt(at, code, latency, None if 200 <= code < 300 else f"HTTP {code}", retry_after=wait)

    # --- the sweeper ---

    def sweep(self) -> list[str]:
        """Pending deliveries due well over ``requeue_after`` seconds ago lost their message: stamp them
        due now and return them, to be published again."""
        now = utcnow()
        overdue = (
            WebhookDelivery.status == "pending",
            WebhookDelivery.next_attempt_at < now - timedelta(seconds=self.settings.requeue_after),
        )
        some = select(WebhookDelivery.id).where(*overdue).limit(SWEEP_BATCH)
        statement = (
            update(WebhookDelivery)
            .where(WebhookDelivery.id.in_(some), *overdue)
            .values(next_attempt_at=now)
            .returning(WebhookDelivery.id)
        )
        with self.sessions.begin() as session:
            return list(session.scalars(statement))

    def sweep_forever(self, celery: Celery, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                if overdue := self.sweep():
                    logger.warning("republishing overdue webhook deliveries", extra={"count": len(overdue)})
                    publish_deliveries(celery, overdue)
            except Exception:  # the database or broker may be briefly away
                logger.exception("webhook sweep failed")


# --- the process ---


def register_deliver_webhook(app: Celery, sender: Sender) -> None:
    @app.task(name=DELIVER_WEBHOOK_TASK)
    def deliver_webhook(delivery_id: str) -> None:
        sender.deliver(delivery_id)


def run_webhooks(settings: Settings) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # our own line logs each attempt, without the URL
    secret = load_secret(settings)
    app = make_celery(settings)

    def retry(delivery_id: str, at: datetime) -> None:
        try:
            app.send_task(DELIVER_WEBHOOK_TASK, args=[delivery_id], eta=at)
        except Exception as error:  # still pending: the sweeper republishes it
            logger.warning(
                "scheduling a webhook retry failed", extra={"delivery_id": delivery_id, "error": repr(error)}
            )

    sender = Sender(make_sessionmaker(make_db_engine(settings)), settings, secret, retry)
    register_deliver_webhook(app, sender)
    stop_sweeping = threading.Event()
    threading.Thread(
        target=sender.sweep_forever, args=(app, settings.reconcile_interval, stop_sweeping), daemon=True
    ).start()
    logger.info("webhooks ready", extra={"queue": settings.webhook_queue})
    try:
        app.worker_main(
            [
                "--quiet",  # no banner
                "worker",
                "--pool=threads",
                f"--concurrency={THREADS}",
                f"--queues={settings.webhook_queue}",
                f"--hostname=pagedq-webhooks-{os.getpid()}@%h",
                f"--loglevel={settings.log_level}",
                "--without-gossip",
                "--without-mingle",
            ]
        )
    finally:
        stop_sweeping.set()
        sender.close()
        logger.info("webhooks stopped")
