"""The operator's endpoints: liveness, readiness (database, broker, a live worker), Prometheus metrics.

With auth on, ``/readyz`` and ``/metrics`` take an admin key (a probe or scraper sends it as a bearer
token); ``/healthz`` is open to all."""

from collections.abc import Callable

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from api.deps import Service, ServiceDep
from api.health.schemas import Health, ModelReadiness, Readiness
from api.http.auth import AdminDep
from api.http.errors import RETRY_LATER
from api.http.metrics import LiveModel, live_models
from api.http.responses import RETRY_AFTER, UNAVAILABLE

router = APIRouter(tags=["operations"])

BROKER_TIMEOUT = 2.0  # seconds a readiness probe waits for the broker


@router.get("/healthz", summary="The process is alive")
async def healthz() -> Health:  # on the event loop itself: it answers when the loop does
    return Health()


@router.get(
    "/readyz",
    summary="The service can run jobs: the database and the broker answer and a live worker serves the model",
    responses={
        503: {
            "model": Readiness,
            "description": "Not ready; `checks` says what is missing",
            "headers": RETRY_AFTER,
        }
    },
)
def readyz(response: Response, service: ServiceDep, _: AdminDep) -> Readiness:
    live: dict[str, LiveModel] = {}
    checks = {
        "database": _check(_ping_database, service),
        "broker": _check(_ping_broker, service),
        "worker": _check(lambda service: _find_live_workers(service, live), service),
    }
    ready = all(result == "ok" for result in checks.values())
    response.status_code = 200 if ready else 503
    if not ready:
        response.headers.update(RETRY_LATER)
    models = {
        entry.name: ModelReadiness(
            kind=entry.kind,
            workers=entry.workers,
            live_workers=serving.workers if (serving := live.get(entry.name)) else 0,
            weights=serving.weights if serving else None,
        )
        for entry in service.models.entries
    }
    return Readiness(status="ok" if ready else "unavailable", checks=checks, models=models)


class NotReady(Exception):
    """A check that ran and found the service not ready; its message is the reason."""


def _check(ping: Callable[[Service], None], service: Service) -> str:
    try:
        ping(service)
    except NotReady as reason:
        return f"failed: {reason}"
    except Exception as error:
        first_line = next(iter(str(error).splitlines()), "")
        return f"failed: {type(error).__name__}: {first_line}"
    return "ok"


def _ping_database(service: Service) -> None:
    with service.db_engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _ping_broker(service: Service) -> None:
    with service.celery.connection_for_write(connect_timeout=BROKER_TIMEOUT) as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, timeout=BROKER_TIMEOUT)


def _find_live_workers(service: Service, live: dict[str, LiveModel]) -> None:
    """Counts each model's live workers into ``live``; each served model needs one, but those listed
    with ``workers = 0`` (scaled from zero elsewhere, by KEDA on their queue's depth: docs/scale-out.md)."""
    timeout = service.settings.heartbeat_timeout
    wanted = [entry.name for entry in service.models.entries if entry.workers > 0]
    live.update(live_models(service.sessions, timeout))
    if missing := [name for name in wanted if name not in live]:
        raise NotReady(f"no worker serving {', '.join(missing)} has heartbeated in the last {timeout:g} s")


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **UNAVAILABLE},
)
def metrics(service: ServiceDep, _: AdminDep) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
