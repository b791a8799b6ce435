"""Beam search over one request's beams, one step at a time, as transformers' ``generate(num_beams=k)``.

Each step ranks every (beam, token) continuation by its beam's summed log-probability, keeps the best
``width`` unfinished ones as the next beams, and files continuations that end (EOS or the length limit)
among the top ``width`` as finished hypotheses, scored ``sum_logprob / generated_len ** length_penalty``.
The search stops when no running beam can still beat the worst kept hypothesis (transformers'
heuristic for ``early_stopping=False``), when ``width`` hypotheses are kept (``True``), or at the
length limit. ``BeamSearcher`` runs the engine's searches, one per request id, on ordinary sequences that
share KV blocks; a search advances once all its beams are computed.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Request, Sequence

NEG_INF = -1.0e9


@dataclass(frozen=True)
class Hypothesis:
    token_ids: list[int]  # generated tokens, EOS included when it ended on one
    sum_logprob: float
    score: float  # length-penalised
    ended_on_eos: bool


@dataclass(frozen=True)
class Continuation:
    beam: int  # index into the beams passed to ``step``
    token: int
    sum_logprob: float


@dataclass
class BeamSearch:
    width: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most ``width``
    improvable: bool = True
    done: bool = False

    def step(
        self,
        log_probs: torch.Tensor,  # [beams, vocab] float32 log-softmax of this step's logits
        beam_logprobs: list[float],
        beam_tokens: list[list[int]],  # each beam's generated tokens so far
        eos_token_ids: list[int],
        max_tokens: int,
    ) -> list[Continuation]:
        """The next beams (``width`` of them, best first); none once the search is done."""
        generated = len(beam_tokens[0])
        vocab = log_probs.shape[1]
        totals = (log_probs + torch.tensor(beam_logprobs, dtype=log_probs.dtype)[:, None]).flatten()
        keep = min(max(2, 1 + len(eos_token_ids)) * self.width, totals.numel())
        top_logprobs, top_index = torch.topk(totals, keep)
        candidates = [
            Continuation(int(i) // vocab, int(i) % vocab, float(s))
            for s, i in zip(top_logprobs.tolist(), top_index.tolist(), strict=True)
        ]
        ends = [c.token in eos_token_ids or generated + 1 >= max_tokens for c in candidates]
        self._file_finished(
            candidates[: self.width], ends[: self.width], beam_tokens, generated + 1, eos_token_ids
        )
        running = [c for c, end in zip(candidates, ends, strict=True) if not end][: self.width]
        self._update_improvable(running, generated + 1, max_tokens)
        self.done = (
            not self.improvable
            or not running
            or (self.early_stopping is True and len(self.finished) == self.width)
        )
        return [] if self.done else running

    def _file_finished(
        self,
        candidates: list[Continuation],
        ends: list[bool],
        beam_tokens: list[list[int]],
        length: int,
        eos_token_ids: list[int],
    ) -> None:
        full = len(self.finished) == self.width
        if not self.improvable or (full and self.early_stopping is True):
            return
        for c, end in zip(candidates, ends, strict=True):
            if end:
                tokens = [*beam_tokens[c.beam], c.token]
                score = c.sum_logprob / length**self.length_penalty
                self.finished.append(Hypothesis(tokens, c.sum_logprob, score, c.token in eos_token_ids))
        self.finished.sort(key=lambda h: h.score, reverse=True)
        del self.finished[self.width :]

    def _update_improvable(self, running: list[Continuation], length: int, max_tokens: int) -> None:
        if not self.improvable or not running or len(self.finished) < self.width:
            return
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = max_tokens
        best_possible = running[0].sum_logprob / length**self.length_penalty
        self.improvable = best_possible > self.finished[-1].score


@dataclass
class RequestSearch:
    """A beam-search request's search, and the next-token log-probabilities of the beams computed so far
    this step: a beam computed before its siblings (a small token budget, a preempted sibling) waits idle."""

    request: Request
    search: BeamSearch
    rows: dict[Sequence, torch.Tensor] = field(default_factory=dict)

    @property
    def is_due(self) -> bool:
        return all(seq in self.rows for seq in self.request.sequences)


@dataclass
class BeamSearcher:
    """Advances the engine's beam searches, one token per step, on sequences the scheduler runs as it runs
    any other. The searches are this class's own, by request id."""

    scheduler: Scheduler
    new_sequence: Callable[[Request, int, list[int]], Sequence]  # a sample of the request with these tokens
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: list[int]
    max_model_len: int
    searches: dict[str, RequestSearch] = field(default_factory=dict)

    def step(self, due: list[tuple[int, Sequence]], logits: torch.Tensor) -> list[RequestOutput]:
        """Take the logits of the beams that are due, given as (logits row, beam), and advance every search
        whose beams all have theirs; returns the outputs of the searches that ended."""
        if not due:
            return []
        log_probs = torch.log_softmax(logits[[row for row, _ in due]].float(), dim=-1).cpu()
        touched: dict[str, RequestSearch] = {}
        for (_, seq), row in zip(due, log_probs, strict=True):
            search = self._search(seq.request)
            search.rows[seq] = row
            touched[seq.request.request_id] = search
        ended = [self._advance(search) for search in touched.values() if search.is_due]
        return [output for output in ended if output is not None]

    def drop(self, request_id: str) -> None:
        """Forget an aborted request's search."""
        self.searches.pop(request_id, None)

    def _search(self, request: Request) -> RequestSearch:
        if request.request_id not in self.searches:
            params = request.params
            search = BeamSearch(params.beam_width, params.length_penalty, params.early_stopping)
            self.searches[request.request_id] = RequestSearch(request, search)
        return self.searches[request.request_id]

    def _advance(self, state: RequestSearch) -> RequestOutput | None:
        request, search, params = state.request, state.search, state.request.params
        beams, rows = request.sequences, state.rows
        state.rows = {}
        chosen = search.step(
            torch.stack([rows[seq] for seq in beams]),
            [seq.cumulative_logprob for seq in beams],
            [seq.output_token_ids for seq in beams],
            [*([] if params.ignore_eos else self.eos_token_ids), *params.stop_token_ids],
            min(params.max_tokens, self.max_model_len - len(request.prompt_token_ids)),
        )
        request.metrics.record_token(time.monotonic())
        if search.done:
            return self._finish(request, search.finished[: params.n])
        self._rebeam(request, beams, chosen)
        return None

    def _rebeam(self, request: Request, beams: list[Sequence], chosen: list[Continuation]) -> None:
        """Make the chosen continuations the request's sequences. A beam continued k times is forked
        k - 1 times (its blocks shared, the last one copied on write); a beam not continued is freed."""
        continued: set[int] = set()
        next_beams = []
        for c in chosen:
            parent = beams[c.beam]
            if c.beam in continued:
                child = self.new_sequence(request, len(request.sequences) + len(next_beams), parent.token_ids)
                self.scheduler.fork(parent, child)
            else:
                continued.add(c.beam)
                child = parent
            next_beams.append((child, c))
        for index, parent in enumerate(beams):
            if index not in continued:
                self.scheduler.finish(parent)
        for seq, c in next_beams:
            seq.token_ids.append(c.token)
            seq.cumulative_logprob = c.sum_logprob
        request.sequences, request.forked = [seq for seq, _ in next_beams], True

    def _finish(self, request: Request, best: list[Hypothesis]) -> RequestOutput:
        del self.searches[request.request_id]
        for seq in request.sequences:
            self.scheduler.finish(seq)
        request.forked = True
        skip_special = request.params.skip_special_tokens
        return request.output([self._completion(i, h, skip_special) for i, h in enumerate(best)])

    def _completion(self, index: int, hypothesis: Hypothesis, skip_special_tokens: bool) -> CompletionOutput:
        last = hypothesis.token_ids[-1]  # the stop reason when a stop token id (not EOS) ended it
        return CompletionOutput(
            index=index,
            text=self.tokenizer.decode(hypothesis.token_ids, skip_special_tokens=skip_special_tokens),
            token_ids=hypothesis.token_ids,
            cumulative_logprob=hypothesis.sum_logprob,
            finish_reason="stop" if hypothesis.ended_on_eos else "length",
            stop_reason=last if hypothesis.ended_on_eos and last not in self.eos_token_ids else None,
        )
