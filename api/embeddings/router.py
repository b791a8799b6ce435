"""``POST /v1/embeddings``: OpenAI's embeddings, each request a durable job of its model underneath
(visible in ``/v1/jobs`` with its timings); the HTTP request waits for its vectors."""

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response

from api.deps import ServiceDep
from api.embeddings import queries
from api.embeddings.schemas import BodyError, read_body
from api.http.auth import CallerDep
from api.openai import online
from api.openai.online import OpenAIError
from api.openai.router import BAD_REQUEST

router = APIRouter(prefix="/v1", tags=["openai"])
EmbeddingsRequest = Annotated[
    dict[str, Any],
    Body(
        description="OpenAI's embeddings body (`model`, `input`, `encoding_format`, `dimensions`), plus "
        "vLLM's `truncate_prompt_tokens`; a problem is a 400 that names the field"
    ),
]


@router.post(
    "/embeddings",
    summary="OpenAI embeddings: one vector per input",
    responses=BAD_REQUEST | {404: {"description": "No such model is served: `model_not_found`"}},
)
async def embeddings(
    body: EmbeddingsRequest, request: Request, service: ServiceDep, caller: CallerDep
) -> Response:
    try:
        try:
            parsed, inputs = read_body(body)
        except BodyError as error:
            raise OpenAIError(400, str(error), error.param, error.code) from None
        job = await queries.submit(service, caller, parsed, inputs)
        finished = await online.finished(service, job, request)
        if finished is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        return JSONResponse(queries.response_body(finished))
    except OpenAIError as error:
        return error.response()
