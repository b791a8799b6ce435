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
from core.embeddings import pack
from core.models import storable
from core.states import JobStatus
from core.timings import ms
from worker.embedding_jobs import JobEmbedding
from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.store import ClaimedJob, Progress, Resume

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
    beams: bool = False  # beam search: its tokens come at the end, not beside their times
    choices: list[Choice] = field(default_factory=lambda: [Choice()])
    token_ids: list[list[int]] = field(default_factory=lambda: [[]])  # each choice's output token ids
    cached_tokens: int = 0
    engine_ms: float = 0.0  # its share of the engine steps it took part in
    started: float | None = None  # monotonic: when claimed (running from then), else first scheduled
    first_token: float | None = None
    token_times_ms: list[float] = field(default_factory=list)  # since started
    times_written: int = 0  # how many of them the database holds
    text_written: int = 0  # how many characters of the first choice's text the database holds
    earlier: Resume | None = None  # the earlier run it goes on from: its start times are kept as stored

    @classmethod
    def of(
        cls, params: dict[str, Any], started: float | None = None, resume: Resume | None = None
    ) -> "JobResult":
        result = cls(
            top_logprobs=params.get("logprobs"), beams=bool(params.get("use_beam_search")), started=started
        )
        if resume is not None:
            result.resume(resume)
        return result

    @classmethod
    def claimed(cls, job: ClaimedJob, started: float) -> "JobResult":
        """A claimed run's: it goes on from the earlier run's flushed tokens if the claim resumed one."""
        return cls.of(job.params, started, job.resume)

    def resume(self, earlier: Resume) -> None:
        """Start from what an earlier run flushed (the store holds it): its tokens, times and text, and its
        start, so the times of the tokens to come count from the job's first start as the earlier ones do."""
        self.earlier = earlier
        self.started = time.monotonic() - (time.time() - earlier.started_at.timestamp())
        if earlier.first_token_at is not None:
            self.first_token = self.started + (earlier.first_token_at - earlier.started_at).total_seconds()
        self.token_ids = [list(earlier.token_ids)]
        self.token_times_ms = list(earlier.times_ms)
        self.choices[0].text = earlier.text
        self.choices[0].completion_tokens = len(earlier.token_ids)
        self.times_written, self.text_written = len(earlier.times_ms), len(earlier.text)

    def fold(self, output: RequestOutput, token_text: TokenText) -> None:
        """Add one step's output: only what is new since the last step."""
        for sample in output.outputs:
            self.choices.extend(Choice() for _ in range(sample.index + 1 - len(self.choices)))
            self.token_ids.extend([] for _ in range(sample.index + 1 - len(self.token_ids)))
            self.token_ids[sample.index].extend(sample.token_ids)
            self._fold_sample(self.choices[sample.index], sample, token_text)
        self.cached_tokens = output.num_cached_tokens
        metrics = output.metrics
        self.engine_ms = ms(metrics.engine_time * 1000)
        if self.started is None:
            self.started = metrics.first_scheduled_time
        self.first_token = self.first_token or metrics.first_token_time
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
        new_times = self.token_times_ms[self.times_written :]
        new_ids = self.token_ids[0][self.times_written : self.times_written + len(new_times)]
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
            token_times_ms=new_times,
            token_times_from=self.times_written,
            token_ids=None if self.beams else new_ids,
            output_token_ids=[list(ids) for ids in self.token_ids] if status is not None else None,
            started_at=self.earlier.started_at if self.earlier else clock.wall(self.started),
            first_token_at=(self.earlier and self.earlier.first_token_at) or clock.wall(self.first_token),
            status=status,
            finish_reason=finish_reason,
            error=error,
        )

    def written(self, progress: Progress) -> None:
        """The store committed ``progress``: later snapshots start after its text and token times."""
        self.times_written = max(self.times_written, progress.token_times_from + len(progress.token_times_ms))
        self.text_written = max(self.text_written, progress.text_from + len(progress.output_text))


@dataclass
class EmbeddingResult:
    """What an embedding run produced: nothing until its inputs' steps ran, then its vectors (written with
    its result, once; no per-token rows). Its "first token" is when its vectors were ready."""

    started: float | None = None  # monotonic: when claimed
    embedded: float | None = None
    vectors: bytes | None = None
    engine_ms: float = 0.0

    @classmethod
    def claimed(cls, job: ClaimedJob, started: float) -> "EmbeddingResult":
        """A claimed run's: an embedding never resumes, it runs again from its inputs."""
        return cls(started=started)

    def fold(self, output: JobEmbedding, token_text: TokenText) -> None:
        self.vectors = pack(output.vectors) if output.error is None else None
        self.embedded = output.finished_time
        self.engine_ms = ms(output.engine_time * 1000)

    def progress(
        self,
        job_id: str,
        attempt: int,
        clock: Clock,
        status: JobStatus | None = None,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> Progress:
        succeeded = status == JobStatus.SUCCEEDED
        return Progress(
            job_id=job_id,
            attempt=attempt,
            engine_ms=self.engine_ms,
            started_at=clock.wall(self.started),
            first_token_at=clock.wall(self.embedded),
            status=status,
            finish_reason=finish_reason,
            error=error,
            embeddings=self.vectors if succeeded else None,
        )

    def written(self, progress: Progress) -> None:
        """Nothing grows while it runs: there is nothing to count."""
