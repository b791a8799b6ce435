"""``/v1/files`` as OpenAI's: upload a batch input file, read a file's description and content, delete it."""

from typing import Annotated, Literal

from fastapi import APIRouter, Form, HTTPException, Response, UploadFile
from starlette.concurrency import run_in_threadpool

from api.deps import ServiceDep
from api.files import queries as files
from api.files.schemas import FileDeleted, FileOut
from api.http.auth import CallerDep
from api.http.problems import Invalid
from api.http.responses import INVALID, error, not_found
from core.retention import MAX_SECONDS, MIN_SECONDS

router = APIRouter(prefix="/v1/files", tags=["files"])
NOT_FOUND = not_found("file")


@router.post(
    "",
    summary="Upload a file (purpose=batch: a JSONL batch input file)",
    responses=error(413, "Larger than PAGEDQ_MAX_UPLOAD_BYTES (200 MiB)") | INVALID,
)
async def upload_file(
    file: UploadFile,
    purpose: Annotated[str, Form(description="batch")],
    service: ServiceDep,
    caller: CallerDep,
    anchor: Annotated[Literal["created_at"] | None, Form(alias="expires_after[anchor]")] = None,
    seconds: Annotated[
        int | None,
        Form(
            alias="expires_after[seconds]",
            ge=MIN_SECONDS,
            le=MAX_SECONDS,
            description="OpenAI's expires_after: the file is deleted this long after its upload (1 hour to "
            "30 days); default: PAGEDQ_RETENTION_DAYS",
        ),
    ] = None,
) -> FileOut:
    if purpose not in files.PURPOSES:
        message = f"purpose {purpose!r} is not supported here; upload batch input files with purpose=batch"
        raise Invalid(("body", "purpose"), message, "unsupported_purpose")
    filename = files.checked_name(file.filename or "upload.jsonl")
    limit = service.settings.max_upload_bytes
    content = await file.read(limit + 1)
    if len(content) > limit:
        raise HTTPException(413, f"the file is larger than {limit} bytes (PAGEDQ_MAX_UPLOAD_BYTES)")
    stored = await run_in_threadpool(files.store, service, caller, filename, purpose, content, seconds)
    return FileOut.of(stored)


@router.get("/{file_id}", summary="Describe a file", responses=NOT_FOUND)
def get_file(file_id: str, service: ServiceDep, caller: CallerDep) -> FileOut:
    return FileOut.of(files.get(service, caller, file_id))


@router.get(
    "/{file_id}/content",
    summary="Download a file's content",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, **NOT_FOUND},
)
def get_file_content(file_id: str, service: ServiceDep, caller: CallerDep) -> Response:
    return Response(files.content(service, caller, file_id), media_type="application/octet-stream")


@router.delete(
    "/{file_id}",
    summary="Delete a file",
    description="A file a batch uses is deleted with the batch (`DELETE /v1/batches/{id}`).",
    responses=error(409, "A batch uses the file") | NOT_FOUND,
)
def delete_file(file_id: str, service: ServiceDep, caller: CallerDep) -> FileDeleted:
    files.delete(service, caller, file_id)
    return FileDeleted(id=file_id, deleted=True)
