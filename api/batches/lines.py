"""A batch input file read line by line: OpenAI request lines checked and turned into job specs.

A line is ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body"}``, its body an OpenAI
chat or completions request. The body maps onto pagedq's ``JobSpec``: OpenAI's fields, plus the
engine's own sampling fields (``top_k``, ``min_p``, ``repetition_penalty``, ``min_tokens``, …) as vLLM
accepts them. A problem is a ``LineError``: its 1-based line, a code, a message, the parameter at fault.
"""

import json
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from pydantic import ValidationError
from pydantic_core import ErrorDetails, from_json

from core.spec import JobSpec, escaped, storable

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]
CHAT, COMPLETIONS, EMBEDDINGS = get_args(
    Endpoint
)  # an embeddings file's lines: api/batches/embedding_lines.py
INPUT = {CHAT: "messages", COMPLETIONS: "prompt"}
MAX_CUSTOM_ID = 512
# OpenAI parameters pagedq cannot honour, accepted only at a value that asks for nothing.
NO_OP: dict[str, tuple[object, ...]] = {
    "best_of": (None, 1),
    "stream": (None, False),
    "echo": (None, False),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
}
IGNORED = frozenset({"user", "store", "service_tier", "parallel_tool_calls", "stream_options"})
BATCH_LEVEL = frozenset({"priority", "webhook_url", "webhook_events"})  # set on the batch, not a line


@dataclass
class LineError(Exception):
    line: int | None
    code: str
    message: str
    param: str | None = None

    def __reduce__(self) -> tuple[type["LineError"], tuple[int | None, str, str, str | None]]:
        return LineError, (self.line, self.code, self.message, self.param)  # it crosses processes

    def as_json(self) -> dict[str, Any]:
        param = escaped(self.param) if self.param else self.param  # it may name a client's key
        return {"code": self.code, "message": escaped(self.message), "line": self.line, "param": param}


class BatchModel(NamedTuple):
    """The one model a batch runs (as OpenAI's: its first line's, else the default), and every served one."""

    name: str
    served: tuple[str, ...]

    def check(self, model: object) -> None:
        if model not in self.served:
            message = f"model {model!r} is not served here; served: {', '.join(self.served)}"
            raise _error("model_not_found", message, "body.model")
        if model != self.name:
            message = f"a batch runs one model, its first line's ({self.name!r}); this line names {model!r}"
            raise _error("model_mismatch", message, "body.model")


def first_model(content: bytes) -> str | None:
    """The model the file's first request line names, if it can be read and names one."""
    raw = next((line for line in content.splitlines() if line.strip()), b"")
    try:
        model = from_json(raw)["body"]["model"]
    except (ValueError, KeyError, TypeError):
        return None
    return model if isinstance(model, str) else None


@dataclass
class Line:
    number: int
    custom_id: str
    spec: JobSpec
    fills_context: bool  # no max_tokens: generate up to the end of the context, as OpenAI does


def read_lines(
    raw_lines: list[bytes], first_number: int, endpoint: str, model: BatchModel
) -> tuple[list[Line], list[LineError]]:
    """Every non-blank line as a ``Line``, or its ``LineError``, numbered from ``first_number``.
    Whether a custom_id repeats is for the caller to see: it sees the whole file."""
    lines: list[Line] = []
    errors: list[LineError] = []
    for number, raw in enumerate(raw_lines, start=first_number):
        if not raw.strip():
            continue
        try:
            lines.append(_line(number, raw, endpoint, model))
        except LineError as error:
            errors.append(error)
    return lines, errors


def _line(number: int, raw: bytes, endpoint: str, model: BatchModel) -> Line:
    try:
        request = envelope(raw, endpoint)
        spec, fills_context = to_spec(request["body"], endpoint, model)
    except LineError as error:
        error.line = number
        raise
    return Line(number, request["custom_id"], spec, fills_context)


def _error(code: str, message: str, param: str | None = None) -> LineError:
    return LineError(None, code, message, param)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = from_json(raw)  # several times faster than json.loads on a request line
    except ValueError as error:
        if "recursion limit" in str(error):  # deeper than anything a request needs (about 200 levels)
            raise _error("invalid_json_line", f"not valid JSON: nested too deeply ({error})") from None
        value = _loads_or_explain(raw)
    if not isinstance(value, dict):
        raise _error("invalid_json_line", f"expected a JSON object, got {type(value).__name__}")
    return value


def _loads_or_explain(raw: bytes) -> Any:
    """A line ``from_json`` rejected, through ``json.loads``: its error, whose messages are the familiar
    ones, or the value where only ``from_json`` is stricter (UTF-16; a lone surrogate escape, refused
    here too: no field of a line may hold one, and an error naming it could not be stored)."""
    try:
        value = json.loads(raw)
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        message = "not valid JSON text: it escapes a lone surrogate (\\ud800-\\udfff)"
        raise _error("invalid_json_line", message) from None
    except json.JSONDecodeError as error:
        raise _error("invalid_json_line", f"not valid JSON: {error.msg} at column {error.colno}") from None
    except UnicodeDecodeError:
        raise _error("invalid_json_line", "not valid UTF-8") from None
    except RecursionError:  # UTF-16 or a surrogate sent it here, past from_json's own depth limit
        raise _error("invalid_json_line", "not valid JSON: nested too deeply") from None
    return value


def envelope(raw: bytes, endpoint: str) -> dict[str, Any]:
    """A line's request (``custom_id``, ``method``, ``url``, ``body``), checked; raises ``LineError``."""
    return _envelope(_json_object(raw), endpoint)


def _envelope(request: dict[str, Any], endpoint: str) -> dict[str, Any]:
    for key in ("custom_id", "method", "url", "body"):
        if key not in request:
            raise _error("missing_required_parameter", f"the line has no {key!r}", key)
    for key in request.keys() - {"custom_id", "method", "url", "body"}:
        raise _error("unknown_parameter", f"unknown parameter {key!r} in the request line", key)
    custom_id = request["custom_id"]
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        message = f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} characters"
        raise _error("invalid_value", message, "custom_id")
    try:
        storable(custom_id)
    except ValueError as error:
        raise _error("invalid_value", f"custom_id: {error}", "custom_id") from None
    if request["method"] != "POST":
        raise _error("invalid_method", f"method must be 'POST', got {request['method']!r}", "method")
    if request["url"] != endpoint:
        message = f"url must be the batch's endpoint {endpoint!r}, got {request['url']!r}"
        raise _error("invalid_url", message, "url")
    if not isinstance(request["body"], dict):
        raise _error("invalid_value", "body must be a JSON object", "body")
    return request


def to_spec(
    body: dict[str, Any], endpoint: str, batch: BatchModel | None, logprobs: int | None = None
) -> tuple[JobSpec, bool]:
    """The job spec for an OpenAI request body, and whether it fills the context (no max_tokens).
    ``batch``: the line's batch, whose one model it must name if it names one (online: None; the
    submission looks the model up).
    ``logprobs``: the top alternatives per token, from OpenAI's logprobs fields that the caller took
    (the online routes return them; a batch line refuses them)."""
    fields = {key: value for key, value in body.items() if value is not None and key not in IGNORED}
    _refuse_what_cannot_be_honoured(fields, endpoint)
    if logprobs is not None:
        fields["logprobs"] = logprobs
    if batch is not None and "model" in fields:
        batch.check(fields["model"])
    if INPUT[endpoint] not in fields:
        raise _error(
            "missing_required_parameter", f"the body has no {INPUT[endpoint]!r}", f"body.{INPUT[endpoint]}"
        )
    _rename_max_tokens(fields)
    _structured(fields)
    if isinstance(fields.get("stop"), str):
        fields["stop"] = [fields["stop"]]
    if endpoint == CHAT:
        fields["messages"] = _messages(fields["messages"])
    else:
        fields["prompt"] = _prompt(fields["prompt"])
    fills_context = "max_tokens" not in fields
    if fills_context:  # a placeholder for the context check; set once the prompt's length is known
        fields["max_tokens"] = (
            max(1, fields["min_tokens"]) if isinstance(fields.get("min_tokens"), int) else 1
        )
    try:
        return JobSpec.model_validate(fields), fills_context
    except ValidationError as error:
        raise _from_pydantic(error.errors()[0]) from None


def _refuse_what_cannot_be_honoured(fields: dict[str, Any], endpoint: str) -> None:
    for key in (fields.keys() & NO_OP.keys()) | (fields.keys() & BATCH_LEVEL):
        if key in BATCH_LEVEL:
            message = f"{key!r} is set on the batch (POST /v1/batches), not on its lines"
            raise _error("unsupported_parameter", message, f"body.{key}")
        if fields[key] not in NO_OP[key]:
            message = f"{key}={json.dumps(fields[key])} is not supported; leave it out"
            raise _error("unsupported_parameter", message, f"body.{key}")
        del fields[key]
    other = INPUT[CHAT if endpoint == COMPLETIONS else COMPLETIONS]
    if other in fields:
        message = f"{other!r} belongs to the other endpoint; {endpoint} takes {INPUT[endpoint]!r}"
        raise _error("unknown_parameter", message, f"body.{other}")


GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def _structured(fields: dict[str, Any]) -> None:
    """OpenAI's ``response_format``, vLLM's ``structured_outputs`` and its older ``guided_*`` fields onto
    the contract's one ``structured`` field."""
    given = [key for key in ("response_format", "structured_outputs", *GUIDED) if key in fields]
    if len(given) > 1:
        message = f"give one of {', '.join(given)}: each sets the output's structure"
        raise _error("invalid_value", message, f"body.{given[1]}")
    if not given:
        return
    key = given[0]
    value = fields.pop(key)
    if key in GUIDED:
        fields["structured"] = {GUIDED[key]: value}
    elif key == "structured_outputs":
        fields["structured"] = value
    elif (constraint := _response_format(value)) is not None:
        fields["structured"] = constraint


def _response_format(value: Any) -> dict[str, Any] | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            message = "response_format.json_schema must be an object with a 'schema' object"
            raise _error("invalid_value", message, "body.response_format.json_schema.schema")
        return {"json": spec["schema"]}
    message = f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
    raise _error("invalid_value", message, "body.response_format.type")


def _rename_max_tokens(fields: dict[str, Any]) -> None:
    if "max_completion_tokens" not in fields:
        return
    value = fields.pop("max_completion_tokens")
    if fields.setdefault("max_tokens", value) != value:
        message = "max_tokens and max_completion_tokens differ; give one of them"
        raise _error("invalid_value", message, "body.max_completion_tokens")


def _messages(messages: Any) -> Any:
    """OpenAI's message forms onto pagedq's: ``developer`` is ``system``, text parts are joined."""
    if not isinstance(messages, list):
        return messages  # JobSpec says what is wrong
    return [_message(i, message) for i, message in enumerate(messages)]


def _message(index: int, message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    message = dict(message)
    if message.get("role") == "developer":
        message["role"] = "system"
    if isinstance(content := message.get("content"), list):
        message["content"] = "".join(_text_part(index, part) for part in content)
    return message


def _text_part(index: int, part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    message = f"only text content parts are supported, got {kind!r}"
    raise _error("unsupported_parameter", message, f"body.messages.{index}.content")


def _prompt(prompt: Any) -> Any:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list):
        message = "prompt must be one string (or a list of exactly one); put each prompt on a line of its own"
        raise _error("unsupported_parameter", message, "body.prompt")
    return prompt


def _from_pydantic(error: ErrorDetails) -> LineError:
    param = ".".join(["body", *(str(part) for part in error["loc"])])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return _error("unknown_parameter", f"unknown parameter {param.removeprefix('body.')!r}", param)
    if error["type"] == "missing":
        return _error("missing_required_parameter", f"{param}: {message}", param)
    return _error("invalid_value", f"{param}: {message}", param)
