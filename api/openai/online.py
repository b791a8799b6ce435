"""OpenAI's online endpoints as ordinary jobs: a request is submitted, waited on, and answered in
OpenAI's shapes (``chat.completion``, ``text_completion`` and their stream chunks).

A request body maps onto a job spec as a batch line's body does (``api/batches/lines.py``), with ``n``
and ``stream`` allowed here. Errors use OpenAI's body, ``{"error": {message, type, param, code}}``.
"""

import json
import time
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from fastapi import Request
from fastapi.sse import format_sse_event
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from api.batches.lines import CHAT, LineError, to_spec
from api.deps import Service
from api.http.caller import OPEN, Caller
from api.http.problems import Invalid
from api.jobs import queries as jobs
from api.jobs.streams import job_events
from core.models import Job
from core.openai_format import completion_body
from core.spec import JobSpec
from core.states import TERMINAL

DISCONNECT_POLL_S = 0.25


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


class OnlineRequest(NamedTuple):
    spec: JobSpec
    fills_context: bool  # no max_tokens: it gets what the context leaves once the prompt is encoded
    stream: bool
    include_usage: bool  # the stream ends with a usage chunk


def online_request(body: dict[str, Any], endpoint: str) -> OnlineRequest:
    """A request body mapped and checked: every refusal but the context's (that needs the prompt's tokens)."""
    fields = dict(body)
    stream = fields.pop("stream", None) or False
    options = fields.pop("stream_options", None) or {}
    if stream is not True and stream is not False:
        raise OpenAIError(400, "stream must be true or false", "stream", "invalid_value")
    if stream and fields.get("n", 1) != 1:
        raise OpenAIError(400, "stream supports n=1 only", "n", "unsupported_parameter")
    top_logprobs = _logprobs_asked(fields, endpoint)
    if stream and top_logprobs is not None:
        raise OpenAIError(
            400, "logprobs are returned without stream only", "logprobs", "unsupported_parameter"
        )
    if not isinstance(options, dict) or options.keys() - {"include_usage"}:
        raise OpenAIError(400, "stream_options takes only include_usage", "stream_options", "invalid_value")
    try:
        spec, fills_context = to_spec(fields, endpoint, None, top_logprobs)
    except LineError as error:
        param = (error.param or "").removeprefix("body.") or None
        raise OpenAIError(400, error.message, param, error.code) from None
    return OnlineRequest(spec, fills_context, stream, bool(options.get("include_usage")))


def _logprobs_asked(fields: dict[str, Any], endpoint: str) -> int | None:
    """How many top alternatives per token the request asks for (None: no logprobs), taking the fields.

    Chat: ``logprobs: true`` with ``top_logprobs`` 0..20; completions: ``logprobs`` 0..5."""
    logprobs, top = fields.pop("logprobs", None), fields.pop("top_logprobs", None)
    if endpoint == CHAT:
        if top is not None and logprobs is not True:
            raise OpenAIError(400, "top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
        if logprobs not in (None, True, False) or (
            top is not None and not 0 <= _int(top, "top_logprobs") <= 20
        ):
            raise OpenAIError(400, "logprobs is a boolean; top_logprobs 0 to 20", "logprobs", "invalid_value")
        return (top or 0) if logprobs else None
    if logprobs is not None and not 0 <= _int(logprobs, "logprobs") <= 5:
        raise OpenAIError(400, "logprobs must be an integer from 0 to 5", "logprobs", "invalid_value")
    return logprobs


def _int(value: Any, param: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise OpenAIError(400, f"{param} must be an integer", param, "invalid_value")
    return value


async def submit(service: Service, caller: Caller, spec: JobSpec, fills_context: bool = False) -> Job:
    try:
        job, _ = await jobs.submit(service, caller, spec, None, fills_context)
    except Invalid as error:
        problem = error.errors()[0]
        param = ".".join(str(part) for part in problem["loc"][1:]) or None
        raise OpenAIError(400, problem["msg"], param, problem["type"]) from error
    return job


async def finished(service: Service, job: Job, request: Request) -> Job | None:
    """The finished job, or None when the client went away first (the job is then cancelled unless
    ``PAGEDQ_KEEP_JOBS_OF_DISCONNECTED_CLIENTS``)."""
    while not await service.waiter.wait(job.id, timeout=DISCONNECT_POLL_S):
        if await request.is_disconnected():
            await run_in_threadpool(abandon, service, job.id)
            return None
    return await run_in_threadpool(jobs.get, service, OPEN, job.id)  # the caller's own job


def abandon(service: Service, job_id: str) -> None:
    if service.settings.keep_jobs_of_disconnected_clients:
        return
    if jobs.get(service, OPEN, job_id).status not in TERMINAL:  # the caller's own job
        jobs.cancel(service, OPEN, job_id)


def response_body(job: Job, endpoint: str) -> dict[str, Any]:
    if job.status != "succeeded":
        raise OpenAIError(500, f"job {job.id} {job.status}: {job.error or 'no output'}", None, "job_failed")
    created = int((job.started_at or job.queued_at).timestamp())
    return completion_body(job, endpoint, created)


async def stream_chunks(
    service: Service, job: Job, endpoint: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """OpenAI's chunks from the job's live stream, then ``[DONE]``; a client that leaves cancels the job."""
    chunk = _Chunker(job, endpoint)
    done = False
    try:
        if endpoint == CHAT:
            yield chunk.event({"role": "assistant", "content": ""})
        async for event in job_events(service, job):
            if event.event == "delta":
                yield chunk.event(event.data["text"])
            elif event.event == "job":
                final = event.data
                yield chunk.event("", finish_reason=final.finish_reason or "stop")
                if include_usage:
                    yield _sse(chunk.usage(final.usage.model_dump()))
        done = True
        yield format_sse_event(data_str="[DONE]")
    finally:
        if not done:
            abandon(service, job.id)


def _sse(payload: dict[str, Any]) -> bytes:
    return format_sse_event(data_str=json.dumps(payload, ensure_ascii=False))


class _Chunker:
    def __init__(self, job: Job, endpoint: str) -> None:
        self.chat = endpoint == CHAT
        prefix, self.kind = (
            ("chatcmpl-", "chat.completion.chunk") if self.chat else ("cmpl-", "text_completion")
        )
        self.base = {
            "id": prefix + job.id.removeprefix("job_"),
            "object": self.kind,
            "created": int(time.time()),
            "model": job.model,
        }

    def event(self, piece: str | dict[str, str], finish_reason: str | None = None) -> bytes:
        if self.chat:
            delta = piece if isinstance(piece, dict) else ({"content": piece} if piece else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": piece, "finish_reason": finish_reason, "logprobs": None}
        return _sse(self.base | {"choices": [choice]})

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        usage = usage | {"prompt_tokens_details": {"cached_tokens": usage.pop("cached_tokens", 0)}}
        return self.base | {"choices": [], "usage": usage}
