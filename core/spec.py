"""The job spec: what a client may ask of one job.

Its sampling fields are generated from the request contract (contract/sampling.py), and it validates
them by building the engine's ``SamplingParams``: the API refuses exactly what the engine would.
"""

import dataclasses
import operator
import re
from functools import reduce
from types import UnionType
from typing import Annotated, Any, Literal, Self, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    Strict,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from contract import sampling, sampling_defaults
from contract.sampling import ContractError, SamplingParams
from core.webhooks import JobEvent
from core.windows import MAX_WINDOW_HOURS, checked_window

LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON may escape one ("\\ud800"); UTF-8 cannot encode it


def storable(text: str) -> str:
    """The rule for every text a client sends: what PostgreSQL, UTF-8 and the tokenizer all take."""
    if "\x00" in text:
        raise ValueError("text must not contain NUL (\\u0000) characters")
    if LONE_SURROGATE.search(text):
        raise ValueError("text must be valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)")
    return text


def escaped(text: str) -> str:
    """``text`` with what ``storable`` refuses written as escapes: client text echoed in an error."""
    return LONE_SURROGATE.sub(lambda match: f"\\u{ord(match[0]):04x}", text).replace("\x00", "\\u0000")


Text = Annotated[str, AfterValidator(storable)]


def _storable(hint: Any) -> Any:
    """A contract type with every ``str`` in it a ``Text`` (what the database can store), and every
    integer, number and boolean strict, as the contract and OpenAI's API: ``"4"`` and ``true`` are no 4
    or 1."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is str:
        return Text
    if hint in (int, float, bool):
        return Annotated[hint, Strict()]
    if origin is Annotated:
        return Annotated[(_storable(args[0]), *hint.__metadata__)]
    if origin is list:
        return list[_storable(args[0])]
    if origin in (Union, UnionType):
        return reduce(operator.or_, map(_storable, args))
    return hint


# Sampling settings the engine's check accepted, by the repr of their values: a batch's lines mostly
# repeat one, and checking each line's was a fifth of the batch-checking processes' CPU. A repr tells
# 1 from 1.0 and True; a long one (a big JSON schema) is checked each time rather than kept.
ACCEPTED_SETTINGS, ACCEPTED_REPR_CHARS = 4096, 2000
_accepted: set[str] = set()


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _engine_accepts(self) -> Self:
        """The engine's own check (bounds and rules between fields), each problem under its field; once
        per distinct setting (the check depends on the values alone)."""
        settings = repr([self.__dict__[name] for name in sampling.hints()])
        if settings in _accepted:
            return self
        try:
            SamplingParams(**self.engine_params(draw_seed=False))
        except ContractError as error:
            problems = [
                InitErrorDetails(
                    type=PydanticCustomError("value_error", problem.message),
                    loc=(problem.field,),
                    input=getattr(self, problem.field),
                )
                for problem in error.problems
            ]
            raise ValidationError.from_exception_data(type(self).__name__, problems) from None
        if len(settings) <= ACCEPTED_REPR_CHARS:
            if len(_accepted) >= ACCEPTED_SETTINGS:
                _accepted.clear()
            _accepted.add(settings)
        return self

    def engine_params(
        self, model_defaults: dict[str, Any] | None = None, draw_seed: bool = True
    ) -> dict[str, Any]:
        """The keyword arguments of the engine's ``SamplingParams``; with ``model_defaults`` (the model's
        generation config), those replace the contract's defaults for what the request left out.
        ``draw_seed=False`` leaves an unset seed unset (a check that keeps nothing needs none: a seed is
        a system call's random bits, a few percent of accepting a job)."""
        params = self.model_dump(include=set(sampling.hints()))
        params = sampling_defaults.with_model_defaults(params, self.model_fields_set, model_defaults or {})
        if draw_seed and params.get("seed") is None:  # chosen now and stored with the job: replayable
            params["seed"] = sampling.new_seed()
        return params


SamplingSpec = create_model(
    "SamplingSpec",
    __base__=_Sampling,
    __doc__="The engine's sampling parameters, with its names, defaults, bounds and rules (vLLM's meanings).",
    # pydantic takes a dataclass field's default (or factory) and its metadata (the description) as they are
    **{f.name: (_storable(sampling.hints()[f.name]), f) for f in dataclasses.fields(SamplingParams)},
)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: Text


Metadata = dict[Annotated[Text, Field(max_length=64)], Annotated[Text, Field(max_length=512)]]


class JobSpec(SamplingSpec):
    """``POST /v1/jobs``: a ``prompt`` or chat ``messages``, sampling parameters and bookkeeping."""

    prompt: Text | None = Field(None, min_length=1, description="raw text, passed to the model as is")
    messages: list[ChatMessage] | None = Field(
        None, min_length=1, description="a chat; the model's chat template is applied"
    )
    model: str | None = Field(
        None, description="a served generate model (`GET /v1/models`); default: the first listed"
    )
    priority: int = Field(0, ge=-100, le=100, strict=True, description="lower runs first")
    metadata: Metadata = Field(default_factory=dict, max_length=16)
    webhook_url: HttpUrl | None = Field(None, description="receives this job's events (Standard Webhooks)")
    webhook_events: list[JobEvent] | None = Field(
        None, max_length=3, description="the events webhook_url receives; default: all job events"
    )
    completion_window: str | None = Field(
        None,
        description=f"`<N>h`, 1 ≤ N ≤ {MAX_WINDOW_HOURS}: the job's deadline; among queued jobs of equal "
        "aged priority and owner the earliest deadline is claimed first (it never cancels the job)",
    )

    @field_validator("completion_window")
    @classmethod
    def _hours(cls, window: str | None) -> str | None:
        return None if window is None else checked_window(window)

    @model_validator(mode="after")
    def _exactly_one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self
