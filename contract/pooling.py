"""The embedding contract: how a model pools its token states into one vector (``Pooling``, read from the
model's own files) and what an embedding request may ask (``EmbeddingParams``), with the rules between
the two, written once for the API and the engine.

A request's text is cut to ``Pooling.max_seq_length`` tokens (sentence-transformers' ``max_seq_length``,
special tokens included), as sentence-transformers does, or to ``truncate_prompt_tokens`` if it asks for
fewer (vLLM's parameter); a longer ``truncate_prompt_tokens`` than the model takes is refused.
``dimensions`` (OpenAI's) keeps a vector's first ``dimensions`` values, re-normalized, and only a model
trained for it (Matryoshka) takes it.
"""

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Ge, Le

from contract.sampling import ContractError, Problem

PoolingMode = Literal["mean", "cls", "last"]
POOLING_MODES: tuple[str, ...] = ("mean", "cls", "last")
MAX_INPUTS = 2048  # inputs one embedding request may carry (OpenAI's limit)


@dataclass(frozen=True)
class Pooling:
    """A model's pooling: ``mean`` of its tokens' states, the first (``cls``) token's, or the ``last``
    token's (a causal decoder's); ``normalize`` to unit length; the longest input it embeds; the output
    sizes ``dimensions`` may ask for, besides its full ``hidden_size`` (empty: none)."""

    mode: PoolingMode
    normalize: bool
    max_seq_length: int
    hidden_size: int
    dimensions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode must be one of {POOLING_MODES}, got {self.mode!r}")
        if self.max_seq_length < 1 or self.hidden_size < 1:
            raise ValueError(f"max_seq_length and hidden_size must be >= 1, got {self}")


@dataclass(frozen=True)
class EmbeddingParams:
    """What one embedding request may ask, besides its inputs."""

    truncate_prompt_tokens: Annotated[int, Ge(1)] | None = None  # embed at most this many tokens
    dimensions: Annotated[int, Ge(1), Le(65536)] | None = None  # the vector's length (Matryoshka models)

    def check(self, pooling: Pooling) -> None:
        """Raises ``ContractError`` naming each field the model cannot honour."""
        if found := problems(self, pooling):
            raise ContractError(found)


def problems(params: EmbeddingParams, pooling: Pooling) -> list[Problem]:
    found = []
    truncate, dimensions = params.truncate_prompt_tokens, params.dimensions
    if truncate is not None and not 1 <= truncate <= pooling.max_seq_length:
        message = f"truncate_prompt_tokens must be in [1, {pooling.max_seq_length}] (the model's limit)"
        found.append(Problem("truncate_prompt_tokens", f"{message}, got {truncate}"))
    if dimensions is not None and dimensions != pooling.hidden_size and dimensions not in pooling.dimensions:
        sizes = ", ".join(map(str, pooling.dimensions)) if pooling.dimensions else "no other size"
        message = f"dimensions: the model embeds in {pooling.hidden_size} dimensions ({sizes} besides)"
        found.append(Problem("dimensions", f"{message}, got {dimensions}"))
    return found


def token_limit(params: EmbeddingParams, pooling: Pooling) -> int:
    """The most tokens of an input that are embedded."""
    return min(params.truncate_prompt_tokens or pooling.max_seq_length, pooling.max_seq_length)
