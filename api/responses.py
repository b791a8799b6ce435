"""What the OpenAPI document says a route may answer besides its success: shared by every router."""

from typing import Any

from api.schemas import ErrorOut, InvalidOut

Responses = dict[int | str, dict[str, Any]]

INVALID: Responses = {422: {"model": InvalidOut, "description": "Invalid request"}}
DATABASE_DOWN: Responses = {503: {"model": ErrorOut, "description": "The database is unavailable"}}


def error(status: int, description: str) -> Responses:
    return {status: {"model": ErrorOut, "description": description}}


def not_found(what: str) -> Responses:
    return error(404, f"No {what} has this id") | INVALID
