"""What the operator's endpoints answer."""

from typing import Any

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = "ok"


class ModelReadiness(BaseModel):
    kind: str = Field(description="generate or embed")
    workers: int = Field(description="the worker processes it is listed with (0: scaled from zero elsewhere)")
    live_workers: int = Field(description="its workers with a recent heartbeat")
    weights: dict[str, Any] | None = Field(
        description="its newest live worker's weights as loaded: `types` (tensors per type, e.g. "
        '`{"Q4_1": 150, "F32": 61}`), `bytes` in memory and the `kernels` that multiply them; '
        "null while no worker of it is live"
    )


class Readiness(BaseModel):
    status: str = Field(description="ok, or unavailable")
    checks: dict[str, str] = Field(description="per dependency: ok, or why not")
    models: dict[str, ModelReadiness] = Field(default_factory=dict, description="each served model")
