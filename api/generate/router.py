"""``POST /generate``, as vLLM's demo server took it: ``{"prompt", "n", "use_beam_search", "temperature",
"max_tokens", …}`` → ``{"text": [prompt + completion, one per choice]}``. A job underneath, like the rest."""

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from api.deps import ServiceDep
from api.http.auth import CallerDep
from api.http.responses import INVALID, MODEL_REFUSED
from api.openai import online as openai_online
from core.choices import choices_of
from core.spec import JobSpec, SamplingSpec, Text

router = APIRouter(tags=["classic"])


class GenerateIn(SamplingSpec):
    prompt: Text = Field(min_length=1)
    model: str | None = Field(None, description="a served generate model; default: the first listed")
    stream: Literal[False] = Field(
        False, description="streaming: use /v1/completions or /v1/jobs/{id}/events"
    )


class GenerateOut(BaseModel):
    text: list[str] = Field(description="prompt + completion, one per choice (beams best first)")


@router.post(
    "/generate",
    summary="Generate, as vLLM's classic demo server did",
    response_model=GenerateOut,
    responses=INVALID | MODEL_REFUSED,
)
async def generate(body: GenerateIn, request: Request, service: ServiceDep, caller: CallerDep) -> Response:
    spec = JobSpec.model_validate(body.model_dump(exclude={"stream"}))
    try:
        job = await openai_online.submit(service, caller, spec)
    except openai_online.OpenAIError as error:
        return JSONResponse(
            {"detail": [{"type": error.code, "loc": ["body", error.param], "msg": error.message}]},
            status_code=422,
        )
    finished = await openai_online.finished(service, job, request)
    if finished is None:
        return Response(status_code=499)
    return JSONResponse({"text": [body.prompt + choice.text for choice in choices_of(finished)]})
