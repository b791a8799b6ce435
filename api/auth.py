"""Who is calling: the ``Authorization: Bearer`` key of each request, and what it may see.

Every route but ``/healthz`` (and the OpenAPI pages) resolves ``current_caller`` through an app-wide
dependency (``api/app.py``), so no route can forget it. With auth off every caller is ``OPEN``: no key,
sees everything, no limits, as before keys existed. ``Caller.owns`` is the one scoping rule: the list
functions of jobs, batches, files and deliveries filter by it, and ``Caller.find`` is the one lookup by
id, so another key's object is a 404 like a missing one, and so is an expired one.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import Depends, Request
from sqlalchemy import ColumnElement, or_, select, true, update
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.problems import Forbidden, NotFound, Unauthenticated
from core import keys
from core.models import ApiKey, Batch, File, Job, utcnow
from core.settings import Settings

if TYPE_CHECKING:
    from api.deps import Service

logger = logging.getLogger(__name__)
OPEN_PATHS = ("/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
Owned = TypeVar("Owned", Job, Batch, File)  # what a key owns and a route looks up by id
LiveRule = Callable[[datetime], ColumnElement[bool]]  # core/retention.py: not yet expired at a time
LAST_USED_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per key


@dataclass(frozen=True)
class Limits:
    """A key's effective limits: its own where set, else the ``PAGEDQ_KEY_*`` defaults."""

    max_active_jobs: int
    requests_per_second: float
    tokens_per_minute: int
    max_tokens: int | None
    max_n: int
    max_prompt_tokens: int | None

    @classmethod
    def of(cls, key: ApiKey, settings: Settings) -> "Limits":
        own = {name: getattr(key, name) for name in keys.LIMITS}
        return cls(**{name: getattr(settings, f"key_{name}") if v is None else v for name, v in own.items()})


@dataclass(frozen=True)
class Caller:
    key_id: str | None  # None: auth is off
    admin: bool
    limits: Limits | None = None  # None: no limits (auth off, or an admin key)
    name: str = ""

    def owns(self, owner: ColumnElement[str | None]) -> ColumnElement[bool]:
        """The rows this caller may see: an admin every row, a user key those it created."""
        return true() if self.admin else owner == self.key_id

    def find(
        self, session: Session, model: type[Owned], object_id: str, live: LiveRule, *options: Any
    ) -> Owned:
        """The one lookup of a job, batch or file by id, for every route: one that has expired (not
        ``live``), or that another key created, is as missing as one that never was."""
        query = select(model).where(model.id == object_id, live(utcnow()), self.owns(model.key_id))
        if (row := session.scalar(query.options(*options))) is None:
            raise NotFound(model.__name__.lower(), object_id)
        return row


OPEN = Caller(key_id=None, admin=True)


async def current_caller(request: Request) -> Caller:
    service: Service = request.app.state.service
    if not service.settings.auth_required or request.url.path in OPEN_PATHS:
        return OPEN
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("no API key: send it as the header Authorization: Bearer <key>")
    return await run_in_threadpool(_caller_of, service, token.strip())


def _caller_of(service: "Service", token: str) -> Caller:
    with service.sessions() as session:
        key = keys.find(session, token)
        if key is None:
            raise Unauthenticated("the API key is not valid")  # never quote the key
        now = utcnow()
        if key.revoked_at is not None:
            raise Forbidden(f"API key {key.name!r} was revoked")
        if key.expires_at is not None and key.expires_at <= now:
            raise Forbidden(f"API key {key.name!r} expired at {key.expires_at.isoformat()}")
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_EVERY:
            _touch(session, key.id)
        admin = key.role == "admin"
        limits = None if admin else Limits.of(key, service.settings)
        return Caller(key_id=key.id, admin=admin, limits=limits, name=key.name)


_touched: dict[str, float] = {}  # key id -> monotonic time of this process's last write


def _touch(session: Session, key_id: str) -> None:
    """One conditional UPDATE per key a minute at most, from each process (never a write per request)."""
    if time.monotonic() - _touched.get(key_id, float("-inf")) < LAST_USED_EVERY.total_seconds():
        return
    _touched[key_id] = time.monotonic()
    stale = or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < utcnow() - LAST_USED_EVERY)
    session.execute(update(ApiKey).where(ApiKey.id == key_id, stale).values(last_used_at=utcnow()))
    session.commit()


def require_admin(caller: "CallerDep") -> Caller:
    if not caller.admin:
        raise Forbidden("this route is for admin keys; this key's role is user")
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]
AdminDep = Annotated[Caller, Depends(require_admin)]
