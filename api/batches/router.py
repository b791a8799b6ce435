"""``/v1/batches``: OpenAI's Batch API; each line of the input file runs as an ordinary job."""

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.batches import latency as batch_latency
from api.batches import queries as batches
from api.batches.schemas import BatchDeleted, BatchIn, BatchLatency, BatchList, BatchOut
from api.deps import ServiceDep
from api.http.auth import CallerDep
from api.http.responses import INVALID, MODEL_REFUSED, error, not_found

router = APIRouter(prefix="/v1/batches", tags=["batches"])
NOT_FOUND = not_found("batch")

CREATE_DESCRIPTION = """Every line of the input file is checked first: `{custom_id, method: "POST",
url: <endpoint>, body}`, the body an OpenAI request for the endpoint, its prompt tokenized and checked
against the context. If any line is bad the batch is created `failed`, `errors.data` lists every bad line
(1-based `line`, `code`, `message`, `param`) and nothing runs. Otherwise every line becomes a job (see
`GET /v1/jobs?batch_id=`) and the batch is `in_progress`; when all have ended a worker writes the output
file (succeeded lines) and the error file (failed and cancelled lines), in input order, and the batch is
`completed`."""


@router.post(
    "",
    summary="Create a batch from an uploaded file",
    description=CREATE_DESCRIPTION,
    responses=MODEL_REFUSED | error(404, "No such input file, or model") | INVALID,
)
def create_batch(request: BatchIn, service: ServiceDep, caller: CallerDep) -> BatchOut:
    return batches.create(service, caller, request)


@router.get(
    "/{batch_id}", summary="Read a batch: status, request counts, output and error files", responses=NOT_FOUND
)
def get_batch(batch_id: str, service: ServiceDep, caller: CallerDep) -> BatchOut:
    return batches.get(service, caller, batch_id)


@router.get("", summary="List batches, newest first", responses=INVALID)
def list_batches(
    service: ServiceDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=100, description="batches per page")] = 20,
    after: Annotated[str | None, Query(description="a batch id: list the batches older than it")] = None,
) -> BatchList:
    page, has_more = batches.page(service, caller, limit, after)
    return BatchList(
        data=page,
        first_id=page[0].id if page else None,
        last_id=page[-1].id if page else None,
        has_more=has_more,
    )


@router.post(
    "/{batch_id}/cancel",
    summary="Cancel a batch",
    description="Queued requests are cancelled at once, running ones within a second or so; the batch is "
    "`cancelling` until they have stopped, then `cancelled`, with the results finished so far in its files.",
    responses=error(409, "Already finished") | NOT_FOUND,
)
def cancel_batch(batch_id: str, service: ServiceDep, caller: CallerDep) -> BatchOut:
    return batches.cancel(service, caller, batch_id)


@router.delete(
    "/{batch_id}",
    summary="Delete a batch, with its jobs, webhook deliveries and files",
    description="An ended batch is deleted with its jobs, its output and error files and its input file "
    "(unless another batch reads it). A batch still running is refused (409): cancel it first.",
    responses=error(409, "Not ended yet") | NOT_FOUND,
)
def delete_batch(batch_id: str, service: ServiceDep, caller: CallerDep) -> BatchDeleted:
    batches.delete(service, caller, batch_id)
    return BatchDeleted(id=batch_id, deleted=True)


@router.post(
    "/{batch_id}/replay",
    status_code=202,
    summary="pagedq: run every line of an ended batch again, same requests and seeds, as a new batch",
    description="The new batch (202, `Location` its URL) runs as any batch does, with its own output file; "
    "its `replay` names the batch it replays and, once it has ended, counts the lines whose tokens are "
    "`identical` to their originals' and those `different`, and says whether the same model (by content "
    "digest) served them (`same_model`). A batch not ended yet, or one that never ran a line, is a 409.",
    responses={
        202: {"headers": {"Location": {"description": "the new batch's URL", "schema": {"type": "string"}}}}
    }
    | MODEL_REFUSED
    | error(409, "Not ended yet, or no line to replay")
    | NOT_FOUND,
)
def replay_batch(batch_id: str, response: Response, service: ServiceDep, caller: CallerDep) -> BatchOut:
    batch = batches.replay(service, caller, batch_id)
    response.headers["Location"] = f"{router.prefix}/{batch.id}"
    return batch


@router.get(
    "/{batch_id}/latency",
    summary="pagedq: histograms of the batch's end-to-end latency and queue time",
    description="Over the batch's jobs that have ended, in `/metrics`' buckets (milliseconds).",
    responses=NOT_FOUND,
)
def get_batch_latency(batch_id: str, service: ServiceDep, caller: CallerDep) -> BatchLatency:
    return batch_latency.latency(service, caller, batch_id)
