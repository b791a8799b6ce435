"""OpenAI's completion objects (``chat.completion``, ``text_completion``) for a finished job.

Shared by the online endpoints (the API) and batch output files (the worker).
"""

from collections.abc import Callable
from itertools import accumulate
from typing import Any, Protocol

CHAT_ENDPOINT = "/v1/chat/completions"
TokenText = Callable[[int], str]  # a token id's text, from the model's tokenizer


class FinishedJob(Protocol):
    """What a completion body is made of: a ``Job`` or a row of its columns."""

    id: str
    model: str
    output_text: str
    finish_reason: str | None
    choices: list[dict[str, Any]] | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    params: dict[str, Any]
    token_logprobs: list[list[Any]] | None


def completion_body(
    job: FinishedJob, endpoint: str, created: int, token_text: TokenText | None = None
) -> dict[str, Any]:
    chat = endpoint == CHAT_ENDPOINT
    choices = [
        dict(c) for c in job.choices or [{"text": job.output_text, "finish_reason": job.finish_reason}]
    ]
    if token_text is not None and job.token_logprobs:  # batch output rows carry no logprobs
        top = job.params.get("logprobs") or 0
        for choice, tokens in zip(choices, job.token_logprobs, strict=True):
            choice["logprobs"] = (_chat_logprobs if chat else _text_logprobs)(tokens, top, token_text)
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + job.id.removeprefix("job_"),
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": job.model,
        "choices": [_choice(i, choice, chat) for i, choice in enumerate(choices)],
        "usage": {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.completion_tokens,
            "total_tokens": job.prompt_tokens + job.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": job.cached_tokens},
        },
        "system_fingerprint": None,
    }


def _choice(index: int, choice: dict[str, Any], chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": index,
        "finish_reason": choice["finish_reason"],
        "logprobs": choice.get("logprobs"),
    }
    if chat:
        out["message"] = {"role": "assistant", "content": choice["text"], "refusal": None}
    else:
        out["text"] = choice["text"]
    return out


def _top(alternatives: list[list[Any]], k: int) -> list[list[Any]]:
    return sorted(alternatives, key=lambda pair: pair[1], reverse=True)[:k]


def _chat_logprobs(tokens: list[list[Any]], k: int, token_text: TokenText) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = [
        entry(token, logprob) | {"top_logprobs": [entry(t, lp) for t, lp in _top(alternatives, k)]}
        for token, logprob, alternatives in tokens
    ]
    return {"content": content, "refusal": None}


def _text_logprobs(tokens: list[list[Any]], k: int, token_text: TokenText) -> dict[str, Any]:
    texts = [token_text(token) for token, _, _ in tokens]
    offsets = list(accumulate((len(t) for t in texts[:-1]), initial=0))
    return {
        "tokens": texts,
        "token_logprobs": [logprob for _, logprob, _ in tokens],
        "top_logprobs": [{token_text(t): lp for t, lp in _top(alts, k)} for _, _, alts in tokens],
        "text_offset": offsets,
    }
