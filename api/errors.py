"""The error bodies: 422 is ``{"detail": [{"type", "loc", "msg"}]}``, every other error ``{"detail": str}``.

Messages say what is wrong in the client's terms; stack traces stay in the log.
"""

import logging
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

logger = logging.getLogger(__name__)


def invalid(loc: tuple[str, ...], message: str, kind: str) -> RequestValidationError:
    """A 422 shaped like FastAPI's own, for what only the service can judge (context length, keys)."""
    return RequestValidationError([{"type": kind, "loc": loc, "msg": message}])


def job_not_found(job_id: str) -> HTTPException:
    return HTTPException(404, f"job {job_id!r} not found")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _unprocessable)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(Exception, _internal)


async def _unprocessable(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return JSONResponse({"detail": [_concise(item) for item in error.errors()]}, status_code=422)


def _concise(error: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's error without the echoed input (a whole prompt) or its exception objects."""
    loc, message = list(error["loc"]), error["msg"].removeprefix("Value error, ")
    if error["type"] == "json_invalid":
        reason = error.get("ctx", {}).get("error", "")
        message = f"the request body is not valid JSON: {reason} (at character {loc[-1]})"
    elif error["type"] == "model_attributes_type" and loc == ["body"]:
        message = "the request body must be a JSON object, sent as Content-Type: application/json"
    return {"type": error["type"], "loc": loc, "msg": message}


async def _database_down(request: Request, error: Exception) -> JSONResponse:
    logger.error("database error on %s %s: %s", request.method, request.url.path, error)
    return JSONResponse({"detail": "the database is unavailable; retry later"}, status_code=503)


async def _internal(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
    return JSONResponse({"detail": "internal error"}, status_code=500)
