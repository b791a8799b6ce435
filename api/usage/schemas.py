from datetime import date

from pydantic import BaseModel, Field


class UsageRow(BaseModel):
    key_id: str | None = Field(description="the key that submitted the jobs; null: none (auth off)")
    key_name: str | None
    model: str
    day: date = Field(description="the UTC day the jobs ended")
    jobs: int = Field(description="jobs that ended that day: succeeded, failed or cancelled")
    prompt_tokens: int
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")
    completion_tokens: int
    engine_ms: float = Field(description="the engine time they used: the sum of their usage.engine_ms")


class UsageList(BaseModel):
    data: list[UsageRow] = Field(description="by day, newest first, then key and model")
