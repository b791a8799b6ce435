"""The request contract: every sampling parameter a request may set (name, type, default, bounds, meaning)
and every rule between parameters, written once.

``SamplingParams`` checks itself on construction. The engine runs it as it is; the API's pydantic
``SamplingSpec`` (core/spec.py) is generated from its fields, so its schema shows the same defaults and
bounds (``annotated_types`` constraints, which pydantic reads as they are), and it builds a
``SamplingParams`` to validate: the API refuses at submission exactly what the engine would refuse.

Adding a parameter is adding a field here, plus its rule in ``_rules`` if it has one. Beam search takes
only the parameters in ``BEAM_SEARCH_TAKES``: any other one must be left at its default.
"""

import operator
import secrets
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from functools import cache
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen

from contract import structured
from contract.structured import StructuredOutput


def param(default: Any, description: str) -> Any:
    """A parameter with its meaning, which the API's schema shows."""
    return field(default=default, metadata={"description": description})


def new_seed() -> int:
    """A seed for a request that set none (in ``SamplingParams.seed``'s range): the API records it with the
    job, the engine with a request of its own, so that every run can be replayed."""
    return secrets.randbits(63)


MAX_N = 16  # the most samples or beams one request runs (a key's limit may be lower: PAGEDQ_KEY_MAX_N)

Strings = Annotated[list[Annotated[str, MinLen(1)]], MaxLen(16)]
TokenIds = Annotated[list[Annotated[int, Ge(0)]], MaxLen(16)]


@dataclass
class SamplingParams:
    """Sampling parameters, with vLLM's names and meanings.

    ``temperature=0`` is greedy decoding. ``top_k=0`` (or -1) and ``top_p=1`` disable those filters.
    ``logprobs=k`` returns, for every generated token, its log-probability and the top ``k``
    alternatives, taken from the model's raw distribution (before penalties and temperature).
    Beam search (transformers' semantics): ``best_of`` beams (default ``n``), the best ``n`` returned.
    """

    max_tokens: Annotated[int, Ge(1)] = param(16, "tokens to generate at most")
    min_tokens: Annotated[int, Ge(0)] = param(0, "tokens to generate before EOS or a stop is honoured")
    temperature: Annotated[float, Ge(0.0), Le(10.0)] = param(1.0, "0 is greedy decoding")
    top_p: Annotated[float, Gt(0.0), Le(1.0)] = param(1.0, "sample from the smallest set this likely")
    top_k: Annotated[int, Ge(-1)] = param(0, "sample from the k likeliest tokens; 0 or -1 disables")
    min_p: Annotated[float, Ge(0.0), Le(1.0)] = param(0.0, "drop tokens below this share of the top one")
    repetition_penalty: Annotated[float, Gt(0.0), Le(10.0)] = param(1.0, "> 1 discourages seen tokens")
    presence_penalty: Annotated[float, Ge(-2.0), Le(2.0)] = param(0.0, "> 0 discourages generated tokens")
    frequency_penalty: Annotated[float, Ge(-2.0), Le(2.0)] = param(0.0, "> 0 discourages frequent ones")
    seed: Annotated[int, Ge(0), Lt(2**63)] | None = param(None, "the same seed samples the same tokens")
    stop: Strings = field(default_factory=list, metadata={"description": "strings that end the output"})
    stop_token_ids: TokenIds = field(default_factory=list, metadata={"description": "tokens that end it"})
    ignore_eos: bool = param(False, "generate past the end-of-sequence token")
    logprobs: Annotated[int, Ge(0), Le(20)] | None = param(None, "top alternatives per token")
    skip_special_tokens: bool = param(True, "leave special tokens out of the text")
    include_stop_str_in_output: bool = param(False, "keep the stop string that ended the output")
    n: Annotated[int, Ge(1), Le(MAX_N)] = param(1, "samples to return (beams to return with beam search)")
    use_beam_search: bool = param(False, "beam search over best_of (default n) beams")
    best_of: Annotated[int, Ge(2), Le(MAX_N)] | None = param(None, "beam width")
    length_penalty: Annotated[float, Ge(-10.0), Le(10.0)] = param(1.0, "beam score = logprob / len**this")
    early_stopping: bool | Literal["never"] = param(False, "beam search: stop at n finished beams")
    structured: StructuredOutput | None = field(
        default=None,
        metadata={
            "description": "constrain the output: JSON schema, any JSON object, regex, choice or grammar"
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if isinstance(self.structured, dict):  # as stored with a job, or sent by a client
            try:
                self.structured = StructuredOutput(**self.structured)
            except TypeError as error:
                raise ContractError([Problem("structured", f"structured: {error}")]) from None
        if found := problems(self):
            raise ContractError(found)
        if self.top_k == -1:
            self.top_k = 0

    @property
    def beam_width(self) -> int:
        return self.best_of or self.n

    @property
    def num_sequences(self) -> int:
        """Sequences the request runs at once: its beams, or its n samples."""
        return self.beam_width if self.use_beam_search else self.n

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


# Beam search is greedy (temperature 0) and takes these; every other parameter must keep its default.
BEAM_SEARCH_TAKES = frozenset(
    {"max_tokens", "temperature", "seed", "stop_token_ids", "ignore_eos", "skip_special_tokens"}
    | {"include_stop_str_in_output", "n", "use_beam_search", "best_of", "length_penalty", "early_stopping"}
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a request: the parameter at fault, and what is wrong in the client's terms."""

    field: str
    message: str


class ContractError(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(problem.message for problem in problems))
        self.problems = problems


def problems(params: SamplingParams) -> list[Problem]:
    """Everything wrong with ``params``: values of the wrong type first (as OpenAI's API, no string or
    boolean for a number: ``"4"`` and ``true`` are not 4 and 1), then out of bounds, then rules between
    parameters."""
    if found := list(_wrong_types(params)):
        return found
    for name, on_items, constraint in bounds():
        value = getattr(params, name)
        if value is None:
            continue
        for where, item in enumerate(value) if on_items else [(None, value)]:
            attribute, holds, wording = BOUNDS[type(constraint)]
            limit = getattr(constraint, attribute)
            if not holds(item, limit):  # NaN holds no bound
                shown = len(item) if isinstance(constraint, MinLen | MaxLen) else repr(item)
                label = name if where is None else f"{name}.{where}"
                found.append(Problem(name, f"{label} must be {wording.format(limit)}, got {shown}"))
    return found or list(_rules(params))


def _wrong_types(params: SamplingParams) -> Iterator[Problem]:
    for name, on_items, kind in scalars():
        value = getattr(params, name)
        if value is None:
            continue
        for where, item in enumerate(value) if on_items else [(None, value)]:
            if not _is(item, kind):
                label = name if where is None else f"{name}.{where}"
                yield Problem(name, f"{label} must be {KIND_WORDS[kind]}, got {item!r}")


KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false"}


def _is(value: Any, kind: type) -> bool:
    """Strict, as JSON means it: a bool is no number, and an integer is a number."""
    if kind is bool or isinstance(value, bool):
        return kind is bool and isinstance(value, bool)
    return isinstance(value, int if kind is int else int | float)


def _rules(p: SamplingParams) -> Iterator[Problem]:
    if p.min_tokens > p.max_tokens:
        message = f"min_tokens ({p.min_tokens}) must not exceed max_tokens ({p.max_tokens})"
        yield Problem("min_tokens", message)
    if not isinstance(p.early_stopping, bool) and p.early_stopping != "never":
        message = f"early_stopping must be true, false or 'never', got {p.early_stopping!r}"
        yield Problem("early_stopping", message)
    if p.structured is not None and (wrong := structured.problem(p.structured)):
        yield Problem("structured", f"structured: {wrong}")
    if p.structured is not None:
        for name in ("stop", "stop_token_ids"):
            if getattr(p, name):
                message = f"{name} would cut a structured output short of its constraint; leave it out"
                yield Problem(name, message)
        if p.min_tokens:
            message = "min_tokens would force tokens past the end of a structured output; leave it out"
            yield Problem("min_tokens", message)
    if not p.use_beam_search:
        if p.best_of is not None:
            yield Problem("best_of", "best_of is the beam width: it needs use_beam_search")
        return
    if p.beam_width < 2:
        yield Problem("n", f"beam search needs at least 2 beams (best_of or n), got {p.beam_width}")
    if p.beam_width < p.n:
        yield Problem("best_of", f"best_of ({p.beam_width}) must be >= n ({p.n})")
    if p.temperature != 0.0:
        yield Problem("temperature", "beam search is deterministic: temperature must be 0")
    for name, default in defaults().items():
        value = 0 if name == "top_k" and p.top_k == -1 else getattr(p, name)
        if name not in BEAM_SEARCH_TAKES and value != default:
            yield Problem(name, f"beam search does not support {name} (got {value!r}); leave it out")


@cache
def hints() -> dict[str, Any]:
    """Each parameter's type, with its bounds."""
    return get_type_hints(SamplingParams, include_extras=True)


@cache
def defaults() -> dict[str, Any]:
    return {
        f.name: f.default if f.default_factory is MISSING else f.default_factory()
        for f in fields(SamplingParams)
    }


BOUNDS: dict[type, tuple[str, Callable[[Any, Any], bool], str]] = {
    Gt: ("gt", operator.gt, "> {}"),
    Ge: ("ge", operator.ge, ">= {}"),
    Lt: ("lt", operator.lt, "< {}"),
    Le: ("le", operator.le, "<= {}"),
    MinLen: ("min_length", lambda value, least: len(value) >= least, "at least {} long"),
    MaxLen: ("max_length", lambda value, most: len(value) <= most, "at most {} long"),
}


@cache
def scalars() -> list[tuple[str, bool, type]]:
    """Every integer, number or boolean parameter: (parameter, whether its list items are, the type)."""
    found = []
    for name, hint in hints().items():
        on_items = False
        while True:
            origin, args = get_origin(hint), get_args(hint)
            if origin is Annotated:
                hint = args[0]
            elif origin is list:
                on_items, hint = True, args[0]
            elif origin in (Union, UnionType) and len(arms := [a for a in args if a is not NoneType]) == 1:
                hint = arms[0]
            else:
                break
        if hint in KIND_WORDS:
            found.append((name, on_items, hint))
    return found


@cache
def bounds() -> list[tuple[str, bool, Any]]:
    """Every bound the parameters' types carry: (parameter, whether it bounds each list item, constraint)."""
    found = []
    for name, hint in hints().items():
        on_items = False
        while hint is not None:
            origin, args = get_origin(hint), get_args(hint)
            if origin is Annotated:
                found += [(name, on_items, constraint) for constraint in hint.__metadata__]
                hint = args[0]
            elif origin is list:
                on_items, hint = True, args[0]
            elif origin in (Union, UnionType) and len(arms := [a for a in args if a is not NoneType]) == 1:
                hint = arms[0]  # an optional value: None is never out of bounds
            else:
                hint = None
    return found
