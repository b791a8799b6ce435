"""What the OpenAPI document says a route may answer besides its success: shared by every router."""

from typing import Any

from pydantic import BaseModel, Field


class ErrorOut(BaseModel):
    """Every error but 422."""

    detail: str = Field(description="what is wrong")


class Problem(BaseModel):
    type: str = Field(description="a machine-readable kind, e.g. extra_forbidden, json_invalid")
    loc: list[str | int] = Field(description='where: ["body", "max_tokens"], ["header", "Idempotency-Key"]')
    msg: str = Field(description="what is wrong, for a person")


class InvalidOut(BaseModel):
    """A 422: one item per problem found in the request (FastAPI's shape, without the echoed input)."""

    detail: list[Problem]


Responses = dict[int | str, dict[str, Any]]

INVALID: Responses = {422: {"model": InvalidOut, "description": "Invalid request"}}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}  # on a 503

# Every route but /healthz reads the database (with auth on, the caller's key at least) and may count a
# key's limits in Redis: each may answer this while either is away (api/http/errors.py). api/app.py
# declares it for every router's routes, so no route can leave it out (the health router's say it).
UNAVAILABLE: Responses = {
    503: {
        "model": ErrorOut,
        "description": "The database or the broker (Redis) is unavailable; retry later",
        "headers": RETRY_AFTER,
    }
}


def error(status: int, description: str) -> Responses:
    return {status: {"model": ErrorOut, "description": description}}


# A request for a model: one not served, or one whose kind does not do what is asked.
MODEL_REFUSED: Responses = error(404, "No such model is served (`model_not_found`)") | error(
    400, "The model's kind does not do this (chat of an embedding model)"
)


def not_found(what: str) -> Responses:
    return error(404, f"No {what} has this id") | INVALID
