"""One request and its samples: tokens, block table, progress and timings."""

import enum
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from contract.sampling import SamplingParams
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs

if TYPE_CHECKING:
    from concurrent.futures import Future

    from worker.engine.grammar import Matcher


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One sample of a request. Its tokens are the prompt followed by what it generated."""

    request: "Request"
    index: int  # which of the request's n samples
    token_ids: list[int]
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, served by the prefix cache at admission
    cumulative_logprob: float = 0.0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    detokenizer: IncrementalDetokenizer | None = None
    num_emitted_tokens: int = 0  # tokens (and their logprobs) already handed out by step()
    num_tokens_reported: int = 0  # num_tokens when the scheduler last reported it due a token
    # its place in its structured-output constraint; kept through preemption, as its tokens are
    matcher: "Matcher | None" = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:  # not len(output_token_ids): a copy, per sequence and step
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Scheduling order: lower priority value first, then arrival (FCFS), then sample index."""
        return (self.request.priority, self.request.arrival_order, self.index)

    def take_output(self) -> CompletionOutput:
        """What this sample produced since it was last reported (``logprobs`` has one entry per token)."""
        start, self.num_emitted_tokens = self.num_emitted_tokens, self.num_output_tokens
        wants_logprobs = self.request.params.logprobs is not None
        return CompletionOutput(
            index=self.index,
            text=self.detokenizer.take_new_text(self.is_finished),
            token_ids=self.token_ids[self.num_prompt_tokens + start :],
            cumulative_logprob=self.cumulative_logprob if wants_logprobs else None,
            logprobs=self.logprobs[start:] if wants_logprobs else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


_arrival_counter = itertools.count()


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    arrival_order: int = field(default_factory=lambda: next(_arrival_counter))
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.monotonic()))
    sequences: list[Sequence] = field(default_factory=list)
    forked: bool = False  # whether the n samples (or the beams) have been split off the first one
    grammar: "Future[Matcher] | None" = None  # its constraint compiling, until it is scheduled
    compile_deadline: float = 0.0
    error: str | None = None
    resumed: list[int] = field(default_factory=list)  # output tokens of an earlier run it continues from

    @property
    def is_finished(self) -> bool:
        return self.forked and all(s.is_finished for s in self.sequences)

    @property
    def num_cached_tokens(self) -> int:
        return self.sequences[0].num_cached_tokens

    def output(self, samples: list[CompletionOutput]) -> RequestOutput:
        """The request's output since the last one: ``samples`` and the times of the new tokens."""
        if self.is_finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.monotonic()
        new_times, self.metrics.token_times = self.metrics.token_times, []
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=samples,
            finished=self.is_finished,
            metrics=replace(self.metrics, token_times=new_times),
            num_cached_tokens=self.num_cached_tokens,
            error=self.error,
            seed=self.params.seed,
        )


def by_request(seqs: Iterable[Sequence]) -> dict[Request, list[Sequence]]:
    """Sequences grouped by their request, each group in the order given."""
    groups: dict[Request, list[Sequence]] = {}
    for seq in seqs:
        groups.setdefault(seq.request, []).append(seq)
    return groups
