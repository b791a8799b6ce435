"""A job's choices (its n samples, or returned beams) as stored and served: the worker writes them in this
form and the API reads them back unchanged.

A job with one choice keeps it in its own columns (``output_text``, ``finish_reason``,
``completion_tokens``); with more, ``choices`` holds every one. Logprobs, when asked for, are written
with the final result only (``token_logprobs``: per choice, per token), already as text and best first,
so the API serves them without a tokenizer.
"""

from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict


class TokenLogprob(TypedDict):
    token: str  # the chosen token's text
    logprob: float
    top: list[tuple[str, float]]  # (text, logprob) of the most likely tokens, best first, as many as asked


@dataclass
class Choice:
    text: str = ""
    finish_reason: str | None = None  # stop | length | abort
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # stored apart, in token_logprobs

    def stored(self) -> dict[str, Any]:
        """The choice's entry in the ``choices`` column (its logprobs are stored apart)."""
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
        }


class StoredJob(Protocol):
    output_text: str
    finish_reason: str | None
    completion_tokens: int
    choices: list[dict[str, Any]] | None
    token_logprobs: list[list[TokenLogprob]] | None


def choices_of(job: StoredJob) -> list[Choice]:
    """Every choice of a job (running or finished), with its logprobs when it has them."""
    if job.choices:
        choices = [Choice(**choice) for choice in job.choices]
    else:
        choices = [Choice(job.output_text, job.finish_reason, job.completion_tokens)]
    for choice, logprobs in zip(choices, job.token_logprobs or [], strict=False):
        choice.logprobs = logprobs
    return choices
