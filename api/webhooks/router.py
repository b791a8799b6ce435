"""``/v1/jobs/{id}/webhook-deliveries`` and ``/v1/batches/{id}/webhook-deliveries``: what was sent, when,
and how each attempt went."""

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from api.batches import queries as batches
from api.deps import ServiceDep
from api.http.auth import CallerDep
from api.http.responses import not_found
from api.jobs import queries as jobs
from core.models import WebhookDelivery

router = APIRouter(tags=["webhooks"])


class AttemptOut(BaseModel):
    at: datetime
    status_code: int | None = Field(description="the endpoint's HTTP status; null if none came back")
    latency_ms: float
    error: str | None = Field(
        description="why it did not count as delivered, as a generic class: `HTTP <code>`, `timeout`, "
        "`connect error`, `network error`, `refused`, `unresolvable` (never the endpoint's reply)"
    )


class DeliveryOut(BaseModel):
    """One event for one endpoint; ``id`` is the ``webhook-id`` header, the same on every retry."""

    id: str
    event_type: str
    url: str
    status: Literal["pending", "delivered", "failed"]
    attempts: list[AttemptOut]
    next_attempt_at: datetime | None = Field(description="when a pending delivery is tried next")
    created_at: datetime
    payload: dict[str, Any] = Field(description="the JSON body sent")

    @classmethod
    def of(cls, delivery: WebhookDelivery) -> "DeliveryOut":
        fields = ("id", "event_type", "url", "status", "attempts", "next_attempt_at", "created_at", "payload")
        return cls.model_validate({name: getattr(delivery, name) for name in fields})


class DeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeliveryOut] = Field(description="oldest first")


@router.get(
    "/v1/jobs/{job_id}/webhook-deliveries",
    summary="A job's webhook deliveries, with every attempt",
    responses=not_found("job"),
)
def job_deliveries(job_id: str, service: ServiceDep, caller: CallerDep) -> DeliveryList:
    with service.sessions() as session:
        jobs.find(session, caller, job_id)
        return _deliveries(session, WebhookDelivery.job_id == job_id)


@router.get(
    "/v1/batches/{batch_id}/webhook-deliveries",
    summary="A batch's webhook deliveries, with every attempt",
    responses=not_found("batch"),
)
def batch_deliveries(batch_id: str, service: ServiceDep, caller: CallerDep) -> DeliveryList:
    with service.sessions() as session:
        batches.find(session, caller, batch_id)
        return _deliveries(session, WebhookDelivery.batch_id == batch_id)


def _deliveries(session: Session, owned: ColumnElement[bool]) -> DeliveryList:
    query = select(WebhookDelivery).where(owned).order_by(WebhookDelivery.id)
    return DeliveryList(data=[DeliveryOut.of(delivery) for delivery in session.scalars(query)])
