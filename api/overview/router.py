"""``/v1/overview``: the service at a glance (the console's first page)."""

from fastapi import APIRouter

from api.deps import ServiceDep
from api.http.auth import CallerDep
from api.overview import queries as overview
from api.overview.schemas import Overview

router = APIRouter(tags=["operations"])


@router.get(
    "/v1/overview",
    summary="Jobs by state, queue depth and age, live workers with engine gauges, the last hour by minute",
)
def get_overview(service: ServiceDep, caller: CallerDep) -> Overview:
    return overview.overview(service, caller)
