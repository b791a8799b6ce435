"""What every request needs, built once per app and handed to the routes as a dependency."""

from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from api.batch_check import BatchChecker
from api.bulk_publisher import BulkPublisher
from api.live import LiveStreams
from api.metrics import Metrics
from api.problems import Invalid
from api.prompts import PromptEncoder
from api.submitter import Submitter
from api.waiting import JobWaiter
from core.queue import queue_name
from core.settings import Settings
from core.spec import storable


@dataclass
class Service:
    settings: Settings
    db_engine: Engine  # SQLAlchemy's (the API has no LLM engine)
    sessions: sessionmaker[Session]
    celery: Celery
    prompts: PromptEncoder
    batch_checker: BatchChecker
    waiter: JobWaiter
    submitter: Submitter
    live: LiveStreams | None  # live token streams in Redis; None in the embedded mode
    metrics: Metrics
    bulk_publisher: BulkPublisher  # a batch's jobs, published after its response

    @property
    def queue(self) -> str:
        return queue_name(self.settings.served_model_name)


def get_service(request: Request) -> Service:
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
