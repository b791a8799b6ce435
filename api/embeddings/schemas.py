"""``POST /v1/embeddings``' body, as OpenAI takes it, plus vLLM's ``truncate_prompt_tokens``.

``input`` is a string, an array of strings, an array of token ids or an array of arrays of token ids (at
most 2,048 inputs, none empty); ``encoding_format`` ``float`` or ``base64``; ``dimensions`` only where the
model embeds in that size (contract/pooling.py says which).
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from contract.pooling import MAX_INPUTS, EmbeddingParams
from core.spec import Text, storable

KINDS_OF_INPUT = "a string, an array of strings, an array of token ids or an array of arrays of token ids"


class EmbeddingsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Text
    input: Any = Field(description=KINDS_OF_INPUT + f" (at most {MAX_INPUTS} inputs)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[StrictInt, Field(ge=1, le=65536)] | None = None
    truncate_prompt_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    user: Text | None = None  # OpenAI's end-user id: accepted, not used

    def params(self) -> EmbeddingParams:
        return EmbeddingParams(self.truncate_prompt_tokens, self.dimensions)


class BodyError(ValueError):
    def __init__(self, param: str | None, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def read_body(body: dict[str, Any]) -> tuple[EmbeddingsBody, list[str] | list[list[int]]]:
    """The body and its inputs as a list; raises ``BodyError`` naming the field at fault."""
    try:
        parsed = EmbeddingsBody.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(map(str, first["loc"])) or None
        code = "unknown_parameter" if first["type"] == "extra_forbidden" else "invalid_value"
        raise BodyError(param, f"{param}: {first['msg']}" if param else first["msg"], code) from None
    return parsed, inputs_of(parsed.input)


def inputs_of(value: Any) -> list[str] | list[list[int]]:
    """One list of texts or of token-id lists from any of ``input``'s four forms."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BodyError("input", f"input must be {KINDS_OF_INPUT}, and not empty")
    if len(value) > MAX_INPUTS:
        raise BodyError("input", f"input holds {len(value)} inputs; at most {MAX_INPUTS} are taken at once")
    if all(_token_id(v) for v in value):
        value = [value]
    if all(isinstance(v, str) for v in value):
        return [_text(i, v) for i, v in enumerate(value)]
    if all(isinstance(v, list) and all(_token_id(t) for t in v) for v in value):
        if empty := [i for i, v in enumerate(value) if not v]:
            raise BodyError("input", f"input {empty[0]} is empty")
        return value
    raise BodyError("input", f"input must be {KINDS_OF_INPUT}")


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(index: int, text: str) -> str:
    if not text:
        raise BodyError("input", f"input {index} is an empty string; every input must hold text")
    try:
        return storable(text)
    except ValueError as error:
        raise BodyError("input", f"input {index}: {error}") from None
