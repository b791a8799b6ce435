"""The context rule: how many tokens a request may span (prompt + output), and whether one fits; and the
step rule: whether the engine can ever schedule a request's sequences.

The API checks a request at submission and the engine again at ``add_request``, both with these.
"""

from collections.abc import Mapping
from typing import Any

from contract.engine import EngineConfig


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


def step_problem(sequences: int, beam_search: bool, engine: EngineConfig) -> str | None:
    """Why ``engine`` could never schedule a request of ``sequences`` (its n samples, or its beams), or
    None: each sequence needs a seat of ``max_num_seqs``, and a beam search's beams advance together, a
    token each, in one step of the step budget.

    A budget left to the device is the CPU's here, the smaller and so the safe one: the API does not know
    the workers' device, and the engine resolves its own budget into its config before it checks."""
    if sequences > engine.max_num_seqs:
        what = "beams" if beam_search else "samples"
        return f"{sequences} {what} need a seat each; the engine has {engine.max_num_seqs} (max_num_seqs)"
    budget = engine.step_budget(on_gpu=False)
    if beam_search and sequences > budget:
        return (
            f"a beam search of {sequences} beams advances them together, a token each, but a step "
            f"computes at most {budget} tokens (max_num_batched_tokens)"
        )
    return None
