"""Beam search over one request's beams, one step at a time, as transformers' ``generate(num_beams=k)``.

Each step ranks every (beam, token) continuation by its beam's summed log-probability, keeps the best
``width`` unfinished ones as the next beams, and files continuations that end (EOS or the length limit)
among the top ``width`` as finished hypotheses, scored ``sum_logprob / generated_len ** length_penalty``.
The search stops when no running beam can still beat the worst kept hypothesis (transformers'
heuristic for ``early_stopping=False``), when ``width`` hypotheses are kept (``True``), or at the
length limit. The engine maps the chosen continuations onto sequences that share KV blocks.
"""

from dataclasses import dataclass, field

import torch

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

    def restart(self) -> None:
        """Forget everything: the request was preempted and starts over from its prompt."""
        self.finished, self.improvable, self.done = [], True, False

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
