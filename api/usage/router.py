"""``/v1/usage``: jobs, tokens and engine time per key, model and day."""

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import ServiceDep
from api.http.auth import CallerDep
from api.http.responses import INVALID
from api.usage import queries
from api.usage.schemas import UsageList

router = APIRouter(tags=["operations"])


@router.get(
    "/v1/usage",
    summary="Jobs, tokens and engine time per key, model and UTC day (a user key: its own; an admin: all)",
    responses=INVALID,
)
def get_usage(
    service: ServiceDep,
    caller: CallerDep,
    key: Annotated[str | None, Query(description="only this key's (its name or id)")] = None,
    model: Annotated[str | None, Query(description="only this model's")] = None,
    start: Annotated[date | None, Query(description="from this UTC day on")] = None,
    end: Annotated[date | None, Query(description="up to this UTC day, included")] = None,
) -> UsageList:
    return UsageList(data=queries.usage(service, caller, key, model, start, end))
