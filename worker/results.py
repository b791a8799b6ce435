"""A run's result as the engine produces it, shaped into what the store writes.

Pure: no threads, no SQL (the host calls it under its lock). Each step's output is folded in at a cost
that grows with what is new, and each write takes only the text and token times the database does not have
yet (a choice's text only grows: beams are delivered once, at the end).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contract.token_times import token_times_ms
from core.choices import Choice, TokenLogprob
from core.models import storable
from core.states import JobStatus
from core.timings import ms
from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.store import Progress

TokenText = Callable[[int], str]  # a token id's text, from the engine's tokenizer


@dataclass(frozen=True)
class Clock:
    """Wall-clock times of the engine's monotonic timestamps."""

    offset: float = field(default_factory=lambda: time.time() - time.monotonic())

    def wall(self, monotonic: float | None) -> datetime | None:
        return None if monotonic is None else datetime.fromtimestamp(self.offset + monotonic, UTC)


@dataclass
class JobResult:
    """What a run produced so far: its choices, and the timings of its first."""

    top_logprobs: int | None = None  # how many alternatives per token the job asked for; None: no logprobs
    choices: list[Choice] = field(default_factory=lambda: [Choice()])
    cached_tokens: int = 0
    engine_ms: float = 0.0  # its share of the engine steps it took part in
    started: float | None = None  # monotonic: when claimed (running from then), else first scheduled
    first_token: float | None = None
    token_times_ms: list[float] = field(default_factory=list)  # since started
    times_written: int = 0  # how many of them the database holds
    text_written: int = 0  # how many characters of the first choice's text the database holds

    @classmethod
    def of(cls, params: dict[str, Any], started: float | None = None) -> "JobResult":
        return cls(top_logprobs=params.get("logprobs"), started=started)

    def fold(self, output: RequestOutput, token_text: TokenText) -> None:
        """Add one step's output: only what is new since the last step."""
        for sample in output.outputs:
            self.choices.extend(Choice() for _ in range(sample.index + 1 - len(self.choices)))
            self._fold_sample(self.choices[sample.index], sample, token_text)
        self.cached_tokens = output.num_cached_tokens
        metrics = output.metrics
        self.engine_ms = ms(metrics.engine_time * 1000)
        if self.started is None:
            self.started = metrics.first_scheduled_time
        self.first_token = metrics.first_token_time
        if self.started is not None:
            # A step's output carries only its new tokens' times, as its text and token ids.
            self.token_times_ms.extend(token_times_ms(metrics.token_times, self.started))

    def _fold_sample(self, choice: Choice, sample: CompletionOutput, token_text: TokenText) -> None:
        choice.text += sample.text
        choice.completion_tokens += len(sample.token_ids)
        choice.finish_reason = sample.finish_reason or choice.finish_reason
        if self.top_logprobs is not None:
            for token, top in zip(sample.token_ids, sample.logprobs or [], strict=False):
                choice.logprobs.append(self._token_logprob(token, top, token_text))

    def _token_logprob(self, token: int, top: dict[int, float], token_text: TokenText) -> TokenLogprob:
        best = sorted(top.items(), key=lambda pair: pair[1], reverse=True)[: self.top_logprobs]
        return {
            "token": storable(token_text(token)),
            "logprob": top[token],
            "top": [(storable(token_text(t)), logprob) for t, logprob in best],
        }

    def progress(
        self,
        job_id: str,
        attempt: int,
        clock: Clock,
        status: JobStatus | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> Progress:
        """A snapshot for the store: the token times not yet written, logprobs with the final result."""
        logprobs = status is not None and self.top_logprobs is not None
        return Progress(
            job_id=job_id,
            attempt=attempt,
            output_text=self.choices[0].text[self.text_written :],
            text_from=self.text_written,
            completion_tokens=sum(choice.completion_tokens for choice in self.choices),
            choices=[choice.stored() for choice in self.choices] if len(self.choices) > 1 else None,
            token_logprobs=[list(choice.logprobs) for choice in self.choices] if logprobs else None,
            cached_tokens=self.cached_tokens,
            engine_ms=self.engine_ms,
            token_times_ms=self.token_times_ms[self.times_written :],
            token_times_from=self.times_written,
            started_at=clock.wall(self.started),
            first_token_at=clock.wall(self.first_token),
            status=status,
            finish_reason=finish_reason,
            error=error,
        )

    def written(self, progress: Progress) -> None:
        """The store committed ``progress``: later snapshots start after its text and token times."""
        self.times_written = max(self.times_written, progress.token_times_from + len(progress.token_times_ms))
        self.text_written = max(self.text_written, progress.text_from + len(progress.output_text))
