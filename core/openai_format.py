"""OpenAI's completion objects (``chat.completion``, ``text_completion``) for a finished job.

Shared by the online endpoints (the API) and batch output files (the worker).
"""

from itertools import accumulate
from typing import Any, Protocol

from core.choices import Choice, StoredJob, TokenLogprob, choices_of

CHAT_ENDPOINT = "/v1/chat/completions"


class FinishedJob(StoredJob, Protocol):
    """What a completion body is made of: a ``Job`` or a row of its columns."""

    id: str
    model: str
    prompt_tokens: int
    cached_tokens: int


def completion_body(job: FinishedJob, endpoint: str, created: int) -> dict[str, Any]:
    chat = endpoint == CHAT_ENDPOINT
    logprobs = job.token_logprobs is not None
    return {
        "id": ("chatcmpl-" if chat else "cmpl-") + job.id.removeprefix("job_"),
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": job.model,
        "choices": [_choice(i, choice, chat, logprobs) for i, choice in enumerate(choices_of(job))],
        "usage": {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.completion_tokens,
            "total_tokens": job.prompt_tokens + job.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": job.cached_tokens},
        },
        "system_fingerprint": None,
    }


def _choice(index: int, choice: Choice, chat: bool, with_logprobs: bool) -> dict[str, Any]:
    logprobs = (_chat_logprobs if chat else _text_logprobs)(choice.logprobs) if with_logprobs else None
    out: dict[str, Any] = {"index": index, "finish_reason": choice.finish_reason, "logprobs": logprobs}
    if chat:
        out["message"] = {"role": "assistant", "content": choice.text, "refusal": None}
    else:
        out["text"] = choice.text
    return out


def _chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = [
        entry(token["token"], token["logprob"]) | {"top_logprobs": [entry(*top) for top in token["top"]]}
        for token in tokens
    ]
    return {"content": content, "refusal": None}


def _text_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    texts = [token["token"] for token in tokens]
    return {
        "tokens": texts,
        "token_logprobs": [token["logprob"] for token in tokens],
        "top_logprobs": [dict(token["top"]) for token in tokens],
        "text_offset": list(accumulate((len(text) for text in texts[:-1]), initial=0)),
    }
