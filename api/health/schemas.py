"""What the operator's endpoints answer."""

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = "ok"


class Readiness(BaseModel):
    status: str = Field(description="ok, or unavailable")
    checks: dict[str, str] = Field(description="per dependency: ok, or why not")
