"""OpenAI's completion objects (``chat.completion``, ``text_completion``) for a finished job.

Shared by the online endpoints (the API) and batch output files (the worker).
"""

from typing import Any, Protocol

CHAT_ENDPOINT = "/v1/chat/completions"


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


def completion_body(job: FinishedJob, endpoint: str, created: int) -> dict[str, Any]:
    chat = endpoint == CHAT_ENDPOINT
    choices = job.choices or [{"text": job.output_text, "finish_reason": job.finish_reason}]
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
    out: dict[str, Any] = {"index": index, "finish_reason": choice["finish_reason"], "logprobs": None}
    if chat:
        out["message"] = {"role": "assistant", "content": choice["text"], "refusal": None}
    else:
        out["text"] = choice["text"]
    return out
