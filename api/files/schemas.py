"""OpenAI's wire shapes for files; times are Unix seconds."""

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.models import File
from core.retention import MAX_SECONDS, MIN_SECONDS


def unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


class ExpiresAfter(BaseModel):
    """OpenAI's ``expires_after`` (a file) and ``output_expires_after`` (a batch's output files)."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(ge=MIN_SECONDS, le=MAX_SECONDS, description="1 hour to 30 days")


class FileOut(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str = Field(description="batch (uploaded), batch_output (a batch's output or error file)")
    status: Literal["processed"] = "processed"
    expires_at: int | None = Field(None, description="when it is deleted; null: kept until deleted")
    status_details: str | None = None

    @classmethod
    def of(cls, file: File) -> "FileOut":
        return cls(
            id=file.id,
            bytes=file.bytes,
            created_at=int(file.created_at.timestamp()),
            filename=file.filename,
            purpose=file.purpose,
            expires_at=unix(file.expires_at),
        )


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool
