"""``/v1/admin/keys``: make, list and revoke API keys (admin keys only), as ``pagedq keys`` does."""

from datetime import datetime
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import ServiceDep
from api.http.auth import AdminDep
from api.http.problems import Conflict, Invalid, NotFound
from api.http.responses import INVALID, error, not_found
from core import keys
from core.models import ApiKey
from core.spec import Text

router = APIRouter(prefix="/v1/admin/keys", tags=["admin"])
INT32 = 2**31 - 1  # the columns' integer type
ADMIN_ONLY = error(401, "No valid key") | error(403, "Not an admin key")


class KeyLimitsIn(BaseModel):
    """A key's own limits; one left out takes its ``PAGEDQ_KEY_*`` default."""

    max_active_jobs: int | None = Field(
        None, ge=0, le=INT32, description="queued + running jobs, batch lines counted"
    )
    requests_per_second: float | None = Field(None, gt=0, le=1e9, description="submissions per second")
    tokens_per_minute: int | None = Field(
        None, ge=1, le=INT32, description="prompt + max_tokens of online submissions"
    )
    max_tokens: int | None = Field(None, ge=1, le=INT32, description="the largest max_tokens accepted")
    max_n: int | None = Field(None, ge=1, le=INT32, description="the largest n (or beam width) accepted")
    max_prompt_tokens: int | None = Field(
        None, ge=1, le=INT32, description="the longest prompt accepted, in tokens"
    )


class KeyIn(KeyLimitsIn):
    name: Text = Field(min_length=1, max_length=200)
    role: Literal["admin", "user"] = "user"
    expires_in: str | None = Field(None, description="`30d`, `12h`, `90m` or `45s`; default: never")


class KeyOut(KeyLimitsIn):
    id: str
    name: str
    prefix: str = Field(description="the key's first characters, to recognize it by")
    role: Literal["admin", "user"]
    created_at: datetime
    last_used_at: datetime | None = Field(description="updated at most once a minute")
    revoked_at: datetime | None
    expires_at: datetime | None

    @classmethod
    def of(cls, key: ApiKey) -> "KeyOut":
        return cls.model_validate(key, from_attributes=True)


class KeyCreated(KeyOut):
    key: str = Field(description="the key itself: shown this once, never again (only its hash is kept)")


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyOut]


@router.post(
    "", status_code=201, summary="Make a key", responses=ADMIN_ONLY | error(409, "Name in use") | INVALID
)
def create_key(body: KeyIn, service: ServiceDep, _: AdminDep) -> KeyCreated:
    try:
        expires_in = keys.duration(body.expires_in) if body.expires_in else None
    except keys.KeyRefused as refused:
        raise Invalid(("body", "expires_in"), str(refused), "invalid_duration") from None
    limits = body.model_dump(include=set(KeyLimitsIn.model_fields), exclude_none=True)
    with service.sessions.begin() as session:
        try:
            row, key = keys.create(session, body.name, body.role == "admin", expires_in, limits=limits)
        except keys.KeyRefused as refused:
            raise Conflict(str(refused)) from None
        return KeyCreated.model_validate(KeyOut.of(row).model_dump() | {"key": key})


@router.get("", summary="List keys (never the keys themselves)", responses=ADMIN_ONLY)
def list_keys(service: ServiceDep, _: AdminDep) -> KeyList:
    with service.sessions() as session:
        return KeyList(data=[KeyOut.of(row) for row in keys.listed(session)])


@router.delete(
    "/{name_or_id}", summary="Revoke a key, by name or id", responses=ADMIN_ONLY | not_found("key")
)
def revoke_key(name_or_id: str, service: ServiceDep, _: AdminDep) -> KeyOut:
    with service.sessions.begin() as session:
        row = keys.revoke(session, name_or_id)
        if row is None:
            raise NotFound("key", name_or_id)
        return KeyOut.of(row)
