"""The API's entry point: ``create_app`` builds the FastAPI app for one served model."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

from api.batch_check import BatchChecker
from api.body_limit import BodyLimit
from api.bulk_publisher import BulkPublisher
from api.deps import Service, storable_url
from api.errors import install_error_handlers
from api.live import LiveStreams
from api.metrics import Metrics
from api.prompts import PromptEncoder
from api.routes import batches, files, generate, health, jobs, openai, webhooks
from api.submitter import Submitter
from api.waiting import JobWaiter
from core.db import make_db_engine, make_sessionmaker
from core.queue import make_celery, queue_name
from core.settings import Settings
from core.streams import streams_url

DESCRIPTION = """Job-based LLM inference: submit a job, then read its result when it is done (or hold the
request with `Prefer: wait=N`).

Errors: a 422 has FastAPI's body, `{"detail": [{"type": ..., "loc": [...], "msg": ...}]}`, one item per
problem; every other error is `{"detail": "what is wrong"}`."""


def create_app(settings: Settings, model_dir: Path) -> FastAPI:
    service = build_service(settings, model_dir)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await service.waiter.close()
        await run_in_threadpool(service.bulk_publisher.close)
        await run_in_threadpool(service.batch_checker.close)
        service.prompts.close()
        if service.live is not None:
            await service.live.close()
        service.db_engine.dispose()

    app = FastAPI(
        title="pagedq",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        dependencies=[Depends(storable_url)],
    )
    app.state.service = service
    app.include_router(jobs.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(webhooks.router)
    app.include_router(openai.router)
    app.include_router(generate.router)
    app.include_router(health.router)
    app.add_middleware(BodyLimit, settings=settings)
    install_error_handlers(app)
    return app


def build_service(settings: Settings, model_dir: Path) -> Service:
    engine = make_db_engine(settings)
    sessions = make_sessionmaker(engine)
    celery = make_celery(settings)
    queue = queue_name(settings.served_model_name)
    prompts = PromptEncoder(model_dir, settings.max_model_len)
    return Service(
        settings=settings,
        db_engine=engine,
        sessions=sessions,
        celery=celery,
        prompts=prompts,
        batch_checker=BatchChecker(prompts, model_dir, settings.max_model_len, settings.batch_processes),
        waiter=JobWaiter(sessions),
        submitter=Submitter(sessions, celery, queue),
        live=LiveStreams(url) if (url := streams_url(settings)) else None,
        metrics=Metrics(sessions, celery, queue, settings.heartbeat_timeout),
        bulk_publisher=BulkPublisher(celery, queue),
    )
