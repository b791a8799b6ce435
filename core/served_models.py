"""The models a deployment serves, named in one place.

``PAGEDQ_MODELS`` holds the list: inline JSON (``[{"name": ..., "source": ...}, ...]``), or the path of a
``.toml`` file (``[[models]]`` tables) or a ``.json`` file (a list, or ``{"models": [...]}``). Unset, the
list is the chat model of ``PAGEDQ_MODEL`` (with ``PAGEDQ_DTYPE``, ``PAGEDQ_QUANTIZATION`` and
``PAGEDQ_MAX_NUM_SEQS``) and, unless ``PAGEDQ_EMBED_MODEL`` is empty, that embedding model. Each model has
its own queue (``core/queue.py``, ``queue_name``) and its own workers; a worker serves one model.
"""

import json
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from contract.engine import EngineConfig, default_quantization, is_gguf_header, is_gguf_source

if TYPE_CHECKING:
    from core.settings import Settings

Kind = Literal["generate", "embed"]


class ModelEntry(BaseModel):
    """One served model: what clients call it, where its weights are, and how its workers run it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # What clients send as `model` and the queue is named after.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")]
    source: Annotated[str, Field(min_length=1)]  # a built-in name, a Hugging Face directory or a .gguf file
    kind: Kind = "generate"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Left out: "gguf" for a .gguf file (its weights in their own types), else "none" (float).
    quantization: Literal["none", "fp16", "gguf"] = "none"
    seats: Annotated[int, Field(ge=1)] | None = None  # the engine's max_num_seqs; None: the engine's default
    workers: Annotated[int, Field(ge=0)] = 1  # worker processes `pagedq up` starts for it

    @model_validator(mode="before")
    @classmethod
    def _source_quantization(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and data.get("quantization") is None
            and isinstance(data.get("source"), str)
        ):
            return {**data, "quantization": default_quantization(data["source"])}
        return data

    @model_validator(mode="after")
    def _gguf_file(self) -> "ModelEntry":
        if is_gguf_source(self.source) and (problem := gguf_problem(self)):
            raise ValueError(f"source {self.source!r}: {problem}")
        return self

    def engine_config(self, base: EngineConfig) -> EngineConfig:
        """``base`` (the deployment's engine knobs) running this model."""
        seats = {"max_num_seqs": self.seats} if self.seats is not None else {}
        return replace(base, model=self.source, dtype=self.dtype, quantization=self.quantization, **seats)


_ENTRIES = TypeAdapter(list[ModelEntry])


def gguf_problem(entry: ModelEntry) -> str | None:
    """Why ``entry``'s .gguf source cannot be served (None: it looks servable). The file's tensors and
    architecture are checked where it is loaded (worker/engine/gguf_source.py)."""
    if entry.kind != "generate":
        return f"a .gguf file serves kind 'generate', not {entry.kind!r}"
    if entry.quantization != "gguf":
        return (
            f"a .gguf file serves its weights in their GGUF types: quantization 'gguf' (its default), "
            f"not {entry.quantization!r}"
        )
    path = Path(entry.source).expanduser()
    try:
        with path.open("rb") as file:
            head = file.read(8)
    except OSError as error:
        return f"the file cannot be read: {error.strerror or error}"
    if not is_gguf_header(head):
        return "not a GGUF file (no GGUF magic and version 2 or 3 at its start)"
    return None


class ModelsError(ValueError):
    """``PAGEDQ_MODELS`` cannot be read, or names no model by the name asked for: says where and what."""


def parse_models(value: str) -> list[ModelEntry]:
    """``PAGEDQ_MODELS``: inline JSON, or the path of a TOML or JSON models file."""
    text, origin = value, "PAGEDQ_MODELS"
    if not value.lstrip().startswith(("[", "{")):
        path = Path(value).expanduser()
        try:
            text, origin = path.read_text(), str(path)
        except OSError as exc:
            raise ModelsError(f"PAGEDQ_MODELS names a models file that cannot be read: {exc}") from None
    try:
        data = tomllib.loads(text) if origin.endswith(".toml") else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ModelsError(
            f"{origin}: not valid {'TOML' if origin.endswith('.toml') else 'JSON'}: {exc}"
        ) from None
    if isinstance(data, dict):
        data = data.get("models", data)
    try:
        entries = _ENTRIES.validate_python(data)
    except ValidationError as exc:
        raise ModelsError(f"{origin}: {_problems(exc)}") from None
    return _checked(entries, origin)


def _problems(exc: ValidationError, whole: str = "models") -> str:
    """Each problem where it is (``whole``: the list's, or the one entry's) and what it is."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or whole}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )


def _checked(entries: list[ModelEntry], origin: str) -> list[ModelEntry]:
    if not entries:
        raise ModelsError(f"{origin}: the list of models is empty")
    names = [entry.name for entry in entries]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ModelsError(f"{origin}: model names must be unique; listed more than once: {', '.join(twice)}")
    return entries


def served_models(settings: "Settings") -> list[ModelEntry]:
    """The deployment's models, in the order they are listed (the first is the default chat model)."""
    if settings.models:
        return parse_models(settings.models)
    # PAGEDQ_QUANTIZATION left unset: the model's default (a .gguf file's weights in their own types).
    quantization = settings.quantization if "quantization" in settings.model_fields_set else None
    try:
        chat = ModelEntry(
            name=settings.served_model_name,
            source=settings.model,
            dtype=settings.dtype,  # type: ignore[arg-type]  # EngineConfig checks the same values
            quantization=quantization,  # type: ignore[arg-type]
            seats=settings.max_num_seqs,
        )
    except ValidationError as exc:
        raise ModelsError(f"PAGEDQ_MODEL: {_problems(exc, 'the model')}") from None
    if not settings.embed_model or settings.embed_model == chat.name:
        return [chat]
    embed = ModelEntry(
        name=Path(settings.embed_model.rstrip("/")).name, source=settings.embed_model, kind="embed"
    )
    return [chat, embed]


KIND_USES = {"generate": "chat and completions", "embed": "embeddings (/v1/embeddings)"}


def kind_problem(entry: ModelEntry, wanted: Kind) -> str | None:
    """Why ``entry`` cannot serve a request of kind ``wanted`` (None: it can), naming its kind."""
    if entry.kind == wanted:
        return None
    uses = KIND_USES[entry.kind]
    return f"model {entry.name!r} is of kind {entry.kind!r}: it serves {uses}, not {KIND_USES[wanted]}"


def model_named(settings: "Settings", name: str) -> ModelEntry:
    """The served model called ``name``; a worker's ``--model`` and the API's lookups go through it."""
    for entry in served_models(settings):
        if entry.name == name:
            return entry
    known = ", ".join(entry.name for entry in served_models(settings))
    raise ModelsError(f"no model named {name!r} is served here; served: {known}")


def default_model(settings: "Settings") -> ModelEntry:
    """The first generate model listed (else the first listed): a worker's without ``--model``, and what a
    request that names no model runs on."""
    entries = served_models(settings)
    return next((entry for entry in entries if entry.kind == "generate"), entries[0])
