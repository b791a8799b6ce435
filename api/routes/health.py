"""The operator's endpoints: liveness, readiness (database and broker), Prometheus metrics."""

from collections.abc import Callable

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from api.deps import Service, ServiceDep
from api.schemas import Health, Readiness

router = APIRouter(tags=["operations"])

BROKER_TIMEOUT = 2.0  # seconds a readiness probe waits for the broker


@router.get("/healthz", summary="The process is alive")
async def healthz() -> Health:  # on the event loop itself: it answers when the loop does
    return Health()


@router.get(
    "/readyz",
    summary="The database and the broker answer",
    responses={503: {"model": Readiness, "description": "A dependency does not answer; `checks` says which"}},
)
def readyz(response: Response, service: ServiceDep) -> Readiness:
    checks = {"database": _check(_ping_database, service), "broker": _check(_ping_broker, service)}
    ready = all(result == "ok" for result in checks.values())
    response.status_code = 200 if ready else 503
    return Readiness(status="ok" if ready else "unavailable", checks=checks)


def _check(ping: Callable[[Service], None], service: Service) -> str:
    try:
        ping(service)
    except Exception as error:
        first_line = next(iter(str(error).splitlines()), "")
        return f"failed: {type(error).__name__}: {first_line}"
    return "ok"


def _ping_database(service: Service) -> None:
    with service.engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _ping_broker(service: Service) -> None:
    with service.celery.connection_for_write(connect_timeout=BROKER_TIMEOUT) as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, timeout=BROKER_TIMEOUT)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(service: ServiceDep) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)
