"""The context rule: how many tokens a request may span (prompt + output), and whether one fits.

The API checks a prompt at submission and the engine again at ``add_request``, both with these.
"""

from collections.abc import Mapping
from typing import Any


def max_model_len(config: Mapping[str, Any], cap: int | None = None) -> int:
    """A model's context from its Hugging Face config (``PretrainedConfig.to_dict()``), lowered to ``cap``.

    A sliding window smaller than the position embeddings is the limit: the engine's attention is full,
    so it stays where full attention equals windowed attention.
    """
    limits = [config.get("max_position_embeddings"), cap]
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", True):
        limits.append(window)
    known = [limit for limit in limits if limit]
    if not known:
        raise ValueError("the model's config.json has no max_position_embeddings: give max_model_len")
    return int(min(known))


def context_problem(prompt_tokens: int, max_tokens: int, max_model_len: int) -> str | None:
    """Why a prompt with this max_tokens does not fit the context, or None when it does."""
    total = prompt_tokens + max_tokens
    if total <= max_model_len:
        return None
    return (
        f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = {total} tokens "
        f"exceeds the model's context of {max_model_len} tokens"
    )
