"""The job spec: what a client may ask of one job. Sampling fields mirror the engine's SamplingParams."""

import re
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, HttpUrl, model_validator

from core.webhooks import JobEvent

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
StopList = Annotated[list[Annotated[Text, Field(min_length=1)]], Field(max_length=16)]


class SamplingSpec(BaseModel):
    """The engine's sampling parameters, with its names, defaults and bounds (vLLM's meanings)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1, description="tokens to generate at most")
    min_tokens: int = Field(0, ge=0, description="tokens to generate before EOS or a stop is honoured")
    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 is greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 disables")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: StopList = Field(default_factory=list, description="strings that end the output")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=16)
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0, le=20, description="top alternatives per token")
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    n: int = Field(1, ge=1, le=16, description="samples to return (beams to return with beam search)")
    use_beam_search: bool = Field(False, description="beam search over best_of (default n) beams")
    best_of: int | None = Field(None, ge=2, le=16, description="beam width")
    length_penalty: float = Field(1.0, ge=-10.0, le=10.0, description="beam score = logprob / len**this")
    early_stopping: bool | Literal["never"] = False

    @model_validator(mode="after")
    def _min_within_max(self) -> Self:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        return self

    @model_validator(mode="after")
    def _beam_search_is_greedy(self) -> Self:
        if not self.use_beam_search:
            if self.best_of is not None:
                raise ValueError("best_of is the beam width: it needs use_beam_search")
            return self
        width = self.best_of or self.n
        if width < 2 or width < self.n:
            raise ValueError(
                f"beam search needs best_of (or n) >= 2 and >= n, got best_of={width}, n={self.n}"
            )
        if self.temperature != 0.0 or self.stop or self.logprobs is not None:
            raise ValueError("beam search takes temperature 0 and neither stop strings nor logprobs")
        return self

    def engine_params(self) -> dict[str, Any]:
        """The keyword arguments of the engine's ``SamplingParams``."""
        return self.model_dump(include=set(SamplingSpec.model_fields))


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
    model: str | None = Field(None, description="must name the served model when given")
    priority: int = Field(0, ge=-100, le=100, description="lower runs first")
    metadata: Metadata = Field(default_factory=dict, max_length=16)
    webhook_url: HttpUrl | None = Field(None, description="receives this job's events (Standard Webhooks)")
    webhook_events: list[JobEvent] | None = Field(
        None, max_length=3, description="the events webhook_url receives; default: all job events"
    )

    @model_validator(mode="after")
    def _exactly_one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self
