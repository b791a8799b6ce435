"""Who is calling: the ``Authorization: Bearer`` key of each request, resolved to a ``Caller``.

Every route but ``/healthz`` (and the OpenAPI pages) resolves ``current_caller`` through an app-wide
dependency (``api/app.py``), so no route can forget it. With auth off every caller is ``OPEN``: no key,
sees everything, no limits, as before keys existed. What a caller may see is ``api/http/caller.py``.
"""

import logging
import time
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import or_, update
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import Service, ServiceDep
from api.http.caller import OPEN, Caller, Limits
from api.http.problems import Forbidden, Unauthenticated
from core import keys
from core.models import ApiKey, utcnow

logger = logging.getLogger(__name__)
OPEN_PATHS = ("/healthz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
LAST_USED_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per key


async def current_caller(request: Request, service: ServiceDep) -> Caller:
    if not service.settings.auth_required or request.url.path in OPEN_PATHS:
        return OPEN
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("no API key: send it as the header Authorization: Bearer <key>")
    return await run_in_threadpool(_caller_of, service, token.strip())


def _caller_of(service: Service, token: str) -> Caller:
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


async def require_admin(caller: "CallerDep") -> Caller:
    if not caller.admin:
        raise Forbidden("this route is for admin keys; this key's role is user")
    return caller


CallerDep = Annotated[Caller, Depends(current_caller)]
AdminDep = Annotated[Caller, Depends(require_admin)]
