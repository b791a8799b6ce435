"""The API's entry point: ``create_app`` builds the FastAPI app for the served models."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from api.batches import router as batches
from api.batches.bulk_publisher import BulkPublisher
from api.deps import Service, same_origin, storable_url
from api.embeddings import router as embeddings
from api.files import router as files
from api.generate import router as generate
from api.health import router as health
from api.http.auth import current_caller
from api.http.body_limit import BodyLimit
from api.http.errors import install_error_handlers
from api.http.limits import KeyLimiter
from api.http.metrics import Metrics
from api.http.responses import UNAVAILABLE
from api.jobs import router as jobs
from api.jobs.live import LiveStreams
from api.jobs.submitter import Submitter
from api.jobs.waiting import JobWaiter
from api.keys import router as admin_keys
from api.openai import router as openai
from api.overview import router as overview
from api.served_models import Locate, ServedModels, source_dir
from api.usage import router as usage
from api.webhooks import router as webhooks
from contract.heap import freeze_startup_heap
from core import keys
from core.db import make_db_engine, make_sessionmaker
from core.purge import Purger
from core.queue import make_celery
from core.settings import Settings
from core.streams import end_announcer, stream_dropper, streams_url

DESCRIPTION = """Job-based LLM inference: submit a job, then read its result when it is done (or hold the
request with `Prefer: wait=N`).

Errors: a 422 has FastAPI's body, `{"detail": [{"type": ..., "loc": [...], "msg": ...}]}`, one item per
problem; every other error is `{"detail": "what is wrong"}`.

Auth: with auth on (`PAGEDQ_AUTH`), every route but `/healthz` takes `Authorization: Bearer <key>` (401
without a valid key, 403 for a revoked or expired one, or a user key on an admin route); a user key sees
only what it created (another key's id is a 404). `/metrics`, `/readyz` and `/v1/admin/*` are for admin
keys. Each key's limits answer 429 with `Retry-After`.

The web console is served at `/console`; it reads these same routes."""
CONSOLE = Path(__file__).parent / "console"  # static files: HTML, CSS, JS and the vendored uPlot


def create_app(settings: Settings, locate: Locate = source_dir) -> FastAPI:
    """``locate``: a served model's Hugging Face directory. Raises ``keys.NoAdminKey`` when auth is
    required and no key exists or can be made."""
    service = build_service(settings, locate)
    keys.bootstrap(service.sessions, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        freeze_startup_heap()
        yield
        await service.waiter.close()
        await run_in_threadpool(service.bulk_publisher.close)
        await run_in_threadpool(service.models.close)
        if service.live is not None:
            await service.live.close()
        service.db_engine.dispose()

    app = FastAPI(
        title="pagedq",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        # who calls, before what they send
        dependencies=[Depends(current_caller), Depends(storable_url), Depends(same_origin)],
    )
    app.state.service = service
    routers = jobs, files, batches, webhooks, openai, embeddings, generate, admin_keys, overview, usage
    for module in routers:
        app.include_router(module.router, responses=UNAVAILABLE)
    app.include_router(health.router)  # /healthz reads nothing; /readyz and /metrics declare their 503
    app.mount("/console", StaticFiles(directory=CONSOLE, html=True), name="console")
    app.add_middleware(BodyLimit, settings=settings)
    install_error_handlers(app)
    return app


def build_service(settings: Settings, locate: Locate) -> Service:
    engine = make_db_engine(settings)
    sessions = make_sessionmaker(engine)
    celery = make_celery(settings)
    models = ServedModels(settings, locate)
    return Service(
        settings=settings,
        db_engine=engine,
        sessions=sessions,
        celery=celery,
        models=models,
        waiter=JobWaiter(sessions, streams_url(settings)),
        submitter=Submitter(sessions, celery),
        live=LiveStreams(url) if (url := streams_url(settings)) else None,
        metrics=Metrics(sessions, celery, models.names, settings.heartbeat_timeout),
        bulk_publisher=BulkPublisher(celery),
        limiter=KeyLimiter(streams_url(settings)),
        purger=Purger(sessions, settings.purge_chunk, stream_dropper(settings)),
        announce_ended=end_announcer(settings),
    )
