"""OpenAI's online API: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Each request is an ordinary job underneath (persisted, queued by priority, visible in ``/v1/jobs``);
the HTTP request waits on it, or streams it as Server-Sent Events in OpenAI's chunk format.
"""

import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse

from api.batches.lines import CHAT, COMPLETIONS
from api.deps import Service, ServiceDep
from api.http.auth import CallerDep
from api.http.caller import Caller
from api.http.metrics import LiveModel, live_models
from api.http.responses import INVALID, MODEL_REFUSED
from api.openai import online as openai_online
from api.openai.online import OpenAIError
from core.served_models import ModelEntry

router = APIRouter(prefix="/v1", tags=["openai"])
STARTED = int(time.time())
OpenAIBody = Annotated[
    dict[str, Any], Body(description="OpenAI's request body; unsupported fields are a 400 that names them")
]
BAD_REQUEST = (
    INVALID
    | MODEL_REFUSED
    | {400: {"description": "Invalid request: `{error: {message, type, param, code}}`"}}
)
UNKNOWN_MODEL = INVALID | {404: {"description": "No such model is served"}}


@router.post(
    "/chat/completions", summary="OpenAI chat completion, optionally streamed", responses=BAD_REQUEST
)
async def chat_completions(
    body: OpenAIBody, request: Request, service: ServiceDep, caller: CallerDep
) -> Response:
    return await _complete(body, request, service, caller, CHAT)


@router.post("/completions", summary="OpenAI text completion, optionally streamed", responses=BAD_REQUEST)
async def completions(body: OpenAIBody, request: Request, service: ServiceDep, caller: CallerDep) -> Response:
    return await _complete(body, request, service, caller, COMPLETIONS)


async def _complete(
    body: dict[str, Any], request: Request, service: ServiceDep, caller: Caller, endpoint: str
) -> Response:
    try:
        spec, fills_context, stream, include_usage = openai_online.online_request(body, endpoint)
        job = await openai_online.submit(service, caller, spec, fills_context)
        if stream:
            chunks = openai_online.stream_chunks(service, job, endpoint, include_usage)
            return EventSourceResponse(chunks)
        finished = await openai_online.finished(service, job, request)
        if finished is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return JSONResponse(openai_online.response_body(finished, endpoint))
    except OpenAIError as error:
        return error.response()


@router.get("/models", summary="The served models, as OpenAI lists models, with their kind and context")
def list_models(service: ServiceDep) -> dict[str, Any]:
    live = live_models(service.sessions, service.settings.heartbeat_timeout)
    return {"object": "list", "data": [_model(service, entry, live) for entry in service.models.entries]}


@router.get("/models/{model_id:path}", summary="One model", responses=UNKNOWN_MODEL)
def get_model(model_id: str, service: ServiceDep) -> dict[str, Any]:
    live = live_models(service.sessions, service.settings.heartbeat_timeout)
    return _model(service, service.models.entry(model_id), live)


def _model(service: Service, entry: ModelEntry, live: dict[str, LiveModel]) -> dict[str, Any]:
    """OpenAI's fields, then pagedq's: a generate model's context length is its encoder's (loaded
    on first use); an embedding model's is its worker's business (None here). ``weights`` are its newest
    live worker's as loaded (types, bytes, kernels); None while no worker of it is live."""
    generate = entry.kind == "generate"
    serving = live.get(entry.name)
    return {
        "id": entry.name,
        "object": "model",
        "created": STARTED,
        "owned_by": "pagedq",
        "kind": entry.kind,
        "context_length": service.models.encoder(entry.name).context_length if generate else None,
        "dtype": entry.dtype,
        "quantization": entry.quantization,
        "live_workers": serving.workers if serving else 0,
        "weights": serving.weights if serving else None,
    }
