"""Who a request comes from, as values: a ``Caller`` and its key's ``Limits`` (``api/http/auth.py``
resolves them).

``Caller.owns`` is the one scoping rule: the list functions of jobs, batches, files and deliveries filter by
it, and ``Caller.find`` is the one lookup by id, so another key's object is a 404 like a missing one, and so
is an expired one.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, select, true
from sqlalchemy.orm import Session

from api.http.problems import NotFound
from core import keys
from core.models import ApiKey, Batch, File, Job, utcnow
from core.settings import Settings

Owned = TypeVar("Owned", Job, Batch, File)  # what a key owns and a route looks up by id
LiveRule = Callable[[datetime], ColumnElement[bool]]  # core/retention.py: not yet expired at a time


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
