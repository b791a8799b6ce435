"""What every request needs, built once per app and handed to the routes as a dependency."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from celery import Celery
from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.batches.bulk_publisher import BulkPublisher
from api.http.limits import KeyLimiter
from api.http.metrics import Metrics
from api.http.problems import Forbidden, Invalid
from api.jobs.live import LiveStreams
from api.jobs.submitter import Submitter
from api.jobs.waiting import JobWaiter
from api.served_models import ServedModels
from core.purge import Purger
from core.settings import Settings
from core.spec import storable


@dataclass
class Service:
    settings: Settings
    db_engine: Engine  # SQLAlchemy's (the API has no LLM engine)
    sessions: sessionmaker[Session]
    celery: Celery
    models: ServedModels  # each served model's entry, queue, prompt encoder and batch checker
    waiter: JobWaiter
    submitter: Submitter
    live: LiveStreams | None  # live token streams in Redis; None in the embedded mode
    metrics: Metrics
    bulk_publisher: BulkPublisher  # a batch's jobs, published after its response
    limiter: KeyLimiter  # each key's request and token rates
    purger: Purger  # deletes what DELETE routes ask for, as retention does
    # Tells waiting requests (any API process's) of jobs ended here: a queued job cancelled
    # (core/streams.end_announcer); None without Redis.
    announce_ended: Callable[[list[str]], None] | None = None


# A coroutine, as every dependency here: FastAPI runs a plain function in its threadpool, a thread hop there
# and back on every request (tests/api/test_route_dependencies.py).
async def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


async def storable_url(request: Request) -> None:
    """Every route's path and query parameters obey the text rule (PostgreSQL refuses NUL, ``%00``)."""
    params = [("path", *item) for item in request.path_params.items()]
    params += [("query", *item) for item in request.query_params.multi_items()]
    for where, name, value in params:
        for text in (name, value):
            try:
                storable(text)
            except ValueError as error:
                raise Invalid((where, name), f"{where} parameter {name!r}: {error}", "invalid_text") from None


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


async def same_origin(request: Request) -> None:
    """A browser's state-changing request must come from the API's own pages (the console), so a page
    elsewhere cannot make a visitor's browser cancel their jobs, even where the API asks for no key.
    Browsers say where a request comes from: ``Sec-Fetch-Site`` (which a proxy that rewrites ``Host``
    leaves right), else ``Origin``; other clients send neither."""
    if request.method in SAFE_METHODS:
        return
    site = request.headers.get("sec-fetch-site")
    origin = request.headers.get("origin")
    if site is not None:
        refused = site in ("cross-site", "same-site")
    else:
        refused = origin is not None and urlsplit(origin).netloc != request.headers.get("host")
    if refused:
        where = origin or site
        raise Forbidden(f"{request.method} {request.url.path} from another site ({where}) is refused")
