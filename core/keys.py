"""API keys: made, listed and revoked here, by ``pagedq keys`` and ``/v1/admin/keys`` alike.

A key is ``pq_`` and 32 random bytes (``secrets.token_urlsafe``); only its sha256 is stored, with its
first characters for display. A plain sha256 is enough for a key with 256 random bits: nobody can
guess it from its hash, and the deterministic hash is what lets a request find its key with one
indexed lookup. A slow, salted password hash (bcrypt, argon2) protects low-entropy passwords from
guessing, which a random key does not need, and would cost every request its time.
"""

import hashlib
import re
import secrets
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from core.models import ApiKey, utcnow
from core.settings import Settings

KEY_PREFIX = "pq_"
KEY_BYTES = 32
SHOWN = 10  # characters of a key kept for display: ``pq_`` and 7 of its random ones
ROLES = ("admin", "user")
LIMITS = ("max_active_jobs", "requests_per_second", "tokens_per_minute", "max_tokens", "max_n")
LIMITS += ("max_prompt_tokens",)
_DURATION = re.compile(r"(?P<count>\d+)(?P<unit>[smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class KeyRefused(ValueError):
    """A key that cannot be made as asked (a name in use, a malformed key or duration)."""


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def hashed(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m`` or ``45s``."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise KeyRefused(f"expected a duration such as 30d, 12h, 90m or 45s, got {text!r}")
    return timedelta(**{_UNITS[match["unit"]]: int(match["count"])})


def checked_key(key: str) -> str:
    """A key given from outside (``PAGEDQ_ADMIN_KEY``): the prefix and at least 32 bytes' worth of text."""
    if not key.startswith(KEY_PREFIX) or len(key) < len(KEY_PREFIX) + 43:
        raise KeyRefused(
            f"a key starts with {KEY_PREFIX!r} followed by at least 43 random characters (32 bytes); "
            "make one with: python -c \"import secrets; print('pq_' + secrets.token_urlsafe(32))\""
        )
    return key


def create(
    session: Session,
    name: str,
    admin: bool = False,
    expires_in: timedelta | None = None,
    key: str | None = None,
    limits: dict[str, Any] | None = None,
) -> tuple[ApiKey, str]:
    """A new key row (added to ``session``) and the key itself, which is shown once and never stored."""
    if session.scalar(select(ApiKey.id).where(ApiKey.name == name)) is not None:
        raise KeyRefused(f"a key named {name!r} exists already")
    key = checked_key(key) if key is not None else new_key()
    now = utcnow()
    row = ApiKey(
        name=name,
        prefix=key[:SHOWN],
        key_hash=hashed(key),
        role="admin" if admin else "user",
        created_at=now,
        expires_at=now + expires_in if expires_in else None,
        **(limits or {}),
    )
    session.add(row)
    session.flush()
    return row, key


def listed(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at)))


def revoke(session: Session, name_or_id: str) -> ApiKey | None:
    """The key named or numbered so, revoked now (a key revoked before keeps its time); None if none."""
    row = session.scalar(select(ApiKey).where(or_(ApiKey.id == name_or_id, ApiKey.name == name_or_id)))
    if row is not None and row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def find(session: Session, key: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.key_hash == hashed(key)))


class NoAdminKey(RuntimeError):
    """Auth is required and no key exists: the service must not open without one."""


def bootstrap(sessions: sessionmaker[Session], settings: Settings) -> str | None:
    """With auth required and no key yet, the admin key ``PAGEDQ_ADMIN_KEY`` is made (its name returned);
    without that setting the service refuses to start (``NoAdminKey`` says how to make one)."""
    with sessions.begin() as session:
        if not settings.auth_required or session.scalar(select(ApiKey.id).limit(1)) is not None:
            return None
        if not settings.admin_key:
            raise NoAdminKey(
                f"auth is required (PAGEDQ_AUTH={settings.auth}, the API listens on {settings.host}) and "
                "no API key exists: set PAGEDQ_ADMIN_KEY=pq_<43+ random characters> for the first admin "
                "key, or make one with `pagedq keys create --name admin --admin`, or listen on "
                "127.0.0.1 / set PAGEDQ_AUTH=off for an open service"
            )
        try:
            row, _ = create(session, "admin", admin=True, key=settings.admin_key)
        except KeyRefused as error:
            raise NoAdminKey(f"PAGEDQ_ADMIN_KEY: {error}") from None
        return row.name
