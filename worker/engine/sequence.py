"""One request and its samples: tokens, block table, progress and timings."""

import enum
import itertools
import time
from dataclasses import dataclass, field

import torch

from worker.engine.beam_search import BeamSearch
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.outputs import RequestMetrics, TokenLogprobs
from worker.engine.sampling_params import SamplingParams


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
    generator: torch.Generator | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of those, served by the prefix cache at admission
    cumulative_logprob: float = 0.0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    detokenizer: IncrementalDetokenizer | None = None
    num_emitted_tokens: int = 0  # tokens already handed out by step()
    num_emitted_logprobs: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

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
    beam: BeamSearch | None = None  # the search state of a beam-search request

    @property
    def is_finished(self) -> bool:
        return self.forked and all(s.is_finished for s in self.sequences)

    @property
    def num_cached_tokens(self) -> int:
        return self.sequences[0].num_cached_tokens
