"""The error bodies: 422 is ``{"detail": [{"type", "loc", "msg"}]}``, every other error ``{"detail": str}``.

On OpenAI's routes (files, batches, completions, models) the body also carries OpenAI's
``{"error": {"message", "type", "param", "code"}}``, which the ``openai`` SDK puts in its exceptions'
messages.
Messages say what is wrong in the client's terms; stack traces stay in the log.
"""

import logging
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from kombu.exceptions import OperationalError as KombuOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.http.problems import (
    Conflict,
    Forbidden,
    Invalid,
    NotFound,
    Problem,
    TooMany,
    Unauthenticated,
    Unavailable,
    UnknownModel,
    WrongKind,
)
from core.spec import escaped

logger = logging.getLogger(__name__)
OPENAI_ROUTES = (
    "/v1/files",
    "/v1/batches",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
)
RETRY_LATER = {"Retry-After": "5"}  # on every 503: seconds a client should wait before it retries


STATUS = {
    NotFound: 404,
    UnknownModel: 404,
    WrongKind: 400,
    Conflict: 409,
    Unavailable: 503,
    Unauthenticated: 401,
    Forbidden: 403,
    TooMany: 429,
}
# Invalid: 422, as the request validator's
OPENAI_CODES = {401: "invalid_api_key", 403: "forbidden", 429: "rate_limit_exceeded"}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _unprocessable)
    app.add_exception_handler(Invalid, _unprocessable)
    app.add_exception_handler(Problem, _problem)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_down)
    for broker_error in (RedisConnectionError, RedisTimeoutError, KombuOperationalError):
        app.add_exception_handler(broker_error, _broker_down)
    app.add_exception_handler(Exception, _internal)


async def _unprocessable(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError | Invalid)
    problems = [_concise(item) for item in error.errors()]
    body: dict[str, Any] = {"detail": problems}
    if request.url.path.startswith(OPENAI_ROUTES) and problems:
        message = "; ".join(f"{_param(p)}: {p['msg']}" if _param(p) else p["msg"] for p in problems)
        body["error"] = _openai_error(message, _param(problems[0]), problems[0]["type"])
    return JSONResponse(body, status_code=422)


async def _problem(request: Request, error: Exception) -> Response:
    status = next(code for kind, code in STATUS.items() if isinstance(error, kind))
    headers = RETRY_LATER if status == 503 else None
    if isinstance(error, Unauthenticated):
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(error, TooMany):
        headers = error.headers
    code = getattr(error, "code", None)
    param = "model" if isinstance(error, UnknownModel | WrongKind) else None
    return await _http_error(request, HTTPException(status, str(error), headers=headers), code, param)


async def _http_error(
    request: Request, error: Exception, code: str | None = None, param: str | None = None
) -> Response:
    assert isinstance(error, StarletteHTTPException)
    if not request.url.path.startswith(OPENAI_ROUTES):
        return await http_exception_handler(request, error)
    code = code or OPENAI_CODES.get(error.status_code)
    body = {"detail": error.detail, "error": _openai_error(str(error.detail), param, code)}
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


def _openai_error(message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"message": message, "type": "invalid_request_error", "param": param, "code": code}


def _param(problem: dict[str, Any]) -> str | None:
    return ".".join(str(part) for part in problem["loc"] if part != "body") or None


def _concise(error: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's error without the echoed input (a whole prompt) or its exception objects."""
    loc = [escaped(part) if isinstance(part, str) else part for part in error["loc"]]  # a client's key
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "json_invalid":
        reason = error.get("ctx", {}).get("error", "")
        message = f"the request body is not valid JSON: {reason} (at character {loc[-1]})"
    elif error["type"] == "model_attributes_type" and loc == ["body"]:
        message = "the request body must be a JSON object, sent as Content-Type: application/json"
    return {"type": error["type"], "loc": loc, "msg": message}


async def _database_down(request: Request, error: Exception) -> Response:
    where = {"method": request.method, "path": request.url.path}
    logger.error("database unavailable", extra=where | {"error": str(error)})  # no parameters: core/db.py
    return await _problem(request, Unavailable("the database is unavailable; retry later"))


async def _broker_down(request: Request, error: Exception) -> Response:
    """Redis away (the key limits' counters, the queue's depth): a 503, as for the database. Reads that
    need only the database are served meanwhile, and publishing a job waits for the reconciler."""
    where = {"method": request.method, "path": request.url.path}
    logger.error("broker unavailable", extra=where | {"error": str(error)})
    return await _problem(request, Unavailable("the broker (Redis) is unavailable; retry later"))


async def _internal(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=error)
    return JSONResponse({"detail": "internal error"}, status_code=500)
