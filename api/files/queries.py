"""The queries behind ``/v1/files``: files live in the ``files`` table, content and all."""

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, defer

from api.deps import Service
from api.http.caller import Caller
from api.http.problems import Conflict, Invalid
from core.models import Batch, File, utcnow
from core.retention import deadline, file_live
from core.spec import storable

PURPOSES = ("batch",)  # what may be uploaded; batches write ``batch_output`` files themselves


def checked_name(filename: str) -> str:
    """An upload's file name as the ``files`` table takes it: storable text, at most 255 characters."""
    limit = File.filename.type.length  # type: ignore[attr-defined]
    try:
        storable(filename)
    except ValueError as error:
        raise Invalid(("body", "file"), f"the file name: {error}", "invalid_file_name") from None
    if len(filename) > limit:
        message = f"the file name is {len(filename)} characters long; at most {limit} are kept"
        raise Invalid(("body", "file"), message, "invalid_file_name")
    return filename


def store(
    service: Service, caller: Caller, filename: str, purpose: str, content: bytes, expires_after: int | None
) -> File:
    """``expires_after``: seconds the file is kept (None: ``PAGEDQ_RETENTION_DAYS``)."""
    now = utcnow()
    file = File(
        key_id=caller.key_id,
        purpose=purpose,
        filename=filename,
        bytes=len(content),
        content=content,
        created_at=now,
        expires_at=deadline(now, service.settings, expires_after),
    )
    with service.sessions.begin() as session:
        session.add(file)
    return file


def find(session: Session, caller: Caller, file_id: str, *, with_content: bool = False) -> File:
    return caller.find(session, File, file_id, file_live, *(() if with_content else (defer(File.content),)))


def get(service: Service, caller: Caller, file_id: str) -> File:
    """The file's description, without loading its content."""
    with service.sessions() as session:
        return find(session, caller, file_id)


def content(service: Service, caller: Caller, file_id: str) -> bytes:
    with service.sessions() as session:
        return find(session, caller, file_id, with_content=True).content


def delete(service: Service, caller: Caller, file_id: str) -> None:
    with service.sessions.begin() as session:
        file = find(session, caller, file_id)
        if user := _batch_using(session, file_id):
            raise Conflict(f"file {file_id!r} belongs to batch {user!r}; it cannot be deleted")
        session.delete(file)


def _batch_using(session: Session, file_id: str) -> str | None:
    uses = or_(
        Batch.input_file_id == file_id, Batch.output_file_id == file_id, Batch.error_file_id == file_id
    )
    return session.scalar(select(Batch.id).where(uses).limit(1))
