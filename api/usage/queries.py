"""The usage rows: one GROUP BY over ended jobs, by key, model and UTC day. A user key reads only its own
jobs' rows (``Caller.owns``); naming another key narrows to nothing, never widens."""

from datetime import date

from sqlalchemy import ColumnElement, Date, Numeric, cast, func, or_, select
from sqlalchemy.orm import Session

from api.deps import Service
from api.http.caller import Caller
from api.usage.schemas import UsageRow
from core.models import ApiKey, Job


def usage(
    service: Service, caller: Caller, key: str | None, model: str | None, start: date | None, end: date | None
) -> list[UsageRow]:
    with service.sessions() as session:
        day = _utc_day(session)
        query = (
            select(
                Job.key_id,
                ApiKey.name.label("key_name"),
                Job.model,
                day.label("day"),
                func.count().label("jobs"),
                func.coalesce(func.sum(Job.prompt_tokens), 0).label("prompt_tokens"),
                func.coalesce(func.sum(Job.cached_tokens), 0).label("cached_tokens"),
                func.coalesce(func.sum(Job.completion_tokens), 0).label("completion_tokens"),
                func.round(cast(func.coalesce(func.sum(Job.engine_ms), 0), Numeric), 3).label("engine_ms"),
            )
            .outerjoin(ApiKey, ApiKey.id == Job.key_id)
            .where(Job.finished_at.is_not(None), caller.owns(Job.key_id))
            .group_by(Job.key_id, ApiKey.name, Job.model, day)
            .order_by(day.desc(), ApiKey.name, Job.model)
        )
        if key is not None:
            query = query.where(or_(ApiKey.id == key, ApiKey.name == key))
        if model is not None:
            query = query.where(Job.model == model)
        if start is not None:
            query = query.where(day >= start)
        if end is not None:
            query = query.where(day <= end)
        return [UsageRow.model_validate(row._mapping) for row in session.execute(query)]


def _utc_day(session: Session) -> ColumnElement[date]:
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.timezone("UTC", Job.finished_at), Date)
    return func.date(Job.finished_at)  # SQLite keeps UTC times as text
