"""The step-level engine: add requests, run one scheduling step at a time, hand out what is new."""

import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from contract.context import context_problem, max_model_len
from worker.engine.beam_search import BeamSearch, Continuation, Hypothesis
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.default_model import resolve_model
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.model.model_config import ModelConfig
from worker.engine.model_runner import ModelRunner
from worker.engine.outputs import CompletionOutput, RequestOutput
from worker.engine.sampler import Sampler, SamplingRow
from worker.engine.sampling_params import SamplingParams
from worker.engine.scheduler import ScheduledBatch, Scheduler
from worker.engine.sequence import Request, Sequence, SequenceStatus

logger = logging.getLogger("pagedq.engine")


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of blocks in use
    num_preemptions: int
    num_generated_tokens: int  # since the engine started


@dataclass
class LLMEngine:
    config: EngineConfig
    requests: dict[str, Request] = field(default_factory=dict)
    finished_outside_step: list[RequestOutput] = field(default_factory=list)  # aborts
    num_generated_tokens: int = 0

    def __post_init__(self) -> None:
        path = resolve_model(self.config.model)
        self.model_config = ModelConfig.from_pretrained(path)
        self.max_model_len = max_model_len(self.model_config.hf_config.to_dict(), self.config.max_model_len)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
        self.eos_token_ids = self._eos_token_ids(path)
        self.runner = ModelRunner(self.config, self.model_config, self.max_model_len)
        self.block_manager = BlockManager(
            self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching
        )
        self.scheduler = Scheduler(self.config, self.block_manager)
        self.sampler = Sampler()
        logger.info(
            "engine ready: %s on %s (%s), max_model_len %d",
            path,
            self.runner.device,
            self.runner.dtype,
            self.max_model_len,
        )

    def _eos_token_ids(self, path: object) -> list[int]:
        ids = set(self.model_config.eos_token_ids)
        try:
            eos = GenerationConfig.from_pretrained(path).eos_token_id
        except OSError:
            eos = None
        ids.update([eos] if isinstance(eos, int) else eos or [])
        return sorted(ids)

    # --- requests in ---

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
    ) -> None:
        """Queue a request. Raises ValueError at once when it can never be served."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} already exists")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_fits(request_id, token_ids, params)
        request = Request(
            request_id, prompt if isinstance(prompt, str) else None, token_ids, params, priority
        )
        if params.use_beam_search:
            request.beam = BeamSearch(params.beam_width, params.length_penalty, params.early_stopping)
        request.sequences.append(self._new_sequence(request, 0))
        self.requests[request_id] = request
        self.scheduler.add(request.sequences[0])

    def _check_fits(self, request_id: str, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        if max(token_ids) >= self.model_config.vocab_size or min(token_ids) < 0:
            raise ValueError(
                f"request {request_id!r}: token ids must be in [0, {self.model_config.vocab_size})"
            )
        if problem := context_problem(len(token_ids), params.max_tokens, self.max_model_len):
            raise ValueError(f"request {request_id!r}: {problem}")
        total = len(token_ids) + params.max_tokens
        if self.block_manager.blocks_needed(total) > self.block_manager.num_blocks:
            raise ValueError(
                f"request {request_id!r}: needs {total} tokens of KV cache but the whole pool holds "
                f"{self.block_manager.num_blocks * self.config.block_size}"
            )

    def _new_sequence(self, request: Request, index: int, token_ids: list[int] | None = None) -> Sequence:
        seq = Sequence(request, index, list(token_ids or request.prompt_token_ids))
        seed = request.params.seed
        if seed is not None:
            seed = seed if index == 0 else hash((seed, index)) & (2**63 - 1)
            seq.generator = torch.Generator(device=self.runner.device).manual_seed(seed)
        seq.detokenizer = IncrementalDetokenizer(
            self.tokenizer.backend_tokenizer, request.prompt_token_ids, request.params
        )
        return seq

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its final output comes from the next step()."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        for seq in request.sequences:
            if not seq.is_finished:
                self._finish(seq, "abort")
        request.forked = True
        self.finished_outside_step.append(self._output(request, request.sequences))
        return True

    # --- one step ---

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self.finished_outside_step)

    def step(self) -> list[RequestOutput]:
        outputs, self.finished_outside_step = self.finished_outside_step, []
        batch = self.scheduler.schedule()
        if batch.is_empty:
            return outputs
        now = time.monotonic()
        for seq in batch.sequences:
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = now
        logits = self.runner.execute(batch)
        due = list(enumerate(self._advance(batch)))
        outputs += self._beam_steps([(row, s) for row, s in due if s.request.beam is not None], logits)
        rows = self._fork_new_samples([(row, s) for row, s in due if s.request.beam is None])
        if not rows:
            return outputs
        if len(rows) != len(due):
            logits = logits[torch.tensor([row for row, _ in rows], device=logits.device)]
        sampled = self.sampler(logits, [self._sampling_row(seq) for _, seq in rows])
        now = time.monotonic()
        for i, (_, seq) in enumerate(rows):
            self._append_token(seq, sampled.token_ids[i], sampled.logprobs[i], sampled.top_logprobs[i], now)
        return outputs + self._collect_outputs([seq for _, seq in rows])

    def _advance(self, batch: ScheduledBatch) -> list[Sequence]:
        """Count the computed tokens and cache full blocks; returns the sequences due a new token."""
        due = []
        for seq, num_new in zip(batch.sequences, batch.num_new_tokens, strict=True):
            before = seq.num_computed_tokens
            seq.num_computed_tokens += num_new
            self.block_manager.register_full_blocks(seq, before)
            if seq.num_computed_tokens == seq.num_tokens:
                due.append(seq)
        return due

    def _fork_new_samples(self, due: list[tuple[int, Sequence]]) -> list[tuple[int, Sequence]]:
        """Split a request's n samples off its first sequence once its prompt is computed.

        Takes and returns (logits row, sequence) pairs: the samples of one request share the prompt's row.
        """
        rows = []
        for row, seq in due:
            rows.append((row, seq))
            request = seq.request
            if request.forked:
                continue
            request.forked = True
            for index in range(1, request.params.n):
                child = self._new_sequence(request, index, seq.token_ids)
                self.block_manager.fork(seq, child)
                child.status = SequenceStatus.RUNNING
                self.scheduler.running.append(child)
                request.sequences.append(child)
                rows.append((row, child))
        return rows

    # --- beam search ---

    def _beam_steps(self, due: list[tuple[int, Sequence]], logits: torch.Tensor) -> list[RequestOutput]:
        by_request: dict[str, list[tuple[int, Sequence]]] = {}
        for row, seq in due:
            by_request.setdefault(seq.request.request_id, []).append((row, seq))
        outputs = []
        for request_id, rows in by_request.items():
            request = self.requests[request_id]
            beams = [seq for _, seq in rows]
            if len(beams) < len(request.sequences):  # a beam missed this step's budget: all wait a step
                for seq in beams:
                    seq.num_computed_tokens -= 1  # recompute its last token next step
                continue
            log_probs = torch.log_softmax(logits[[row for row, _ in rows]].float(), dim=-1).cpu()
            if output := self._beam_step(request, request.beam, beams, log_probs):
                outputs.append(output)
        return outputs

    def _beam_step(
        self, request: Request, search: BeamSearch, beams: list[Sequence], log_probs: torch.Tensor
    ) -> RequestOutput | None:
        params = request.params
        stop_ids = [*([] if params.ignore_eos else self.eos_token_ids), *params.stop_token_ids]
        chosen = search.step(
            log_probs,
            [seq.cumulative_logprob for seq in beams],
            [seq.output_token_ids for seq in beams],
            stop_ids,
            min(params.max_tokens, self.max_model_len - len(request.prompt_token_ids)),
        )
        now = time.monotonic()
        request.metrics.first_token_time = request.metrics.first_token_time or now
        request.metrics.token_times.append(now)
        self.num_generated_tokens += len(beams)
        if search.done:
            return self._finish_beam_search(request, search.finished[: params.n])
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
                child = self._new_sequence(
                    request, len(request.sequences) + len(next_beams), parent.token_ids
                )
                self.block_manager.fork(parent, child)
                child.status = SequenceStatus.RUNNING
                self.scheduler.running.append(child)
            else:
                continued.add(c.beam)
                child = parent
            next_beams.append((child, c))
        for index, parent in enumerate(beams):
            if index not in continued:
                parent.status = SequenceStatus.FINISHED
                self.scheduler.remove(parent)
        for seq, c in next_beams:
            seq.token_ids.append(c.token)
            seq.cumulative_logprob = c.sum_logprob
        request.sequences, request.forked = [seq for seq, _ in next_beams], True

    def _finish_beam_search(self, request: Request, best: list[Hypothesis]) -> RequestOutput:
        for seq in request.sequences:
            seq.status = SequenceStatus.FINISHED
            self.scheduler.remove(seq)
        request.forked = True
        request.metrics.finished_time = time.monotonic()
        del self.requests[request.request_id]
        skip_special = request.params.skip_special_tokens
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[
                CompletionOutput(
                    index=i,
                    text=self.tokenizer.decode(h.token_ids, skip_special_tokens=skip_special),
                    token_ids=h.token_ids,
                    cumulative_logprob=h.sum_logprob,
                    finish_reason="stop" if h.ended_on_eos else "length",
                    stop_reason=self._beam_stop_reason(h),
                )
                for i, h in enumerate(best)
            ],
            finished=True,
            metrics=request.metrics,
            num_cached_tokens=request.num_cached_tokens,
        )

    def _beam_stop_reason(self, hypothesis: Hypothesis) -> int | None:
        """The stop token id that ended a hypothesis; None for EOS or the length limit."""
        last = hypothesis.token_ids[-1]
        return last if hypothesis.ended_on_eos and last not in self.eos_token_ids else None

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        request = seq.request
        return SamplingRow(
            request.params, seq.generator, request.prompt_token_ids, seq.output_token_ids, self.eos_token_ids
        )

    def _append_token(
        self, seq: Sequence, token: int, logprob: float | None, top: dict | None, now: float
    ) -> None:
        seq.token_ids.append(token)
        if logprob is not None and top is not None:
            seq.cumulative_logprob += logprob
            seq.logprobs.append(top)
        metrics = seq.request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        if seq.index == 0:
            metrics.token_times.append(now)
        self.num_generated_tokens += 1
        reason = self._stop_reason(seq, token)
        if reason is not None:
            self._finish(seq, *reason)

    def _stop_reason(self, seq: Sequence, token: int) -> tuple[str, str | int | None] | None:
        params = seq.request.params
        if token in params.stop_token_ids:
            return "stop", token
        if token in self.eos_token_ids and not params.ignore_eos:
            return "stop", None
        stop = seq.detokenizer.add_token(token)
        if stop is not None:
            return "stop", stop
        if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None

    def _finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        if not isinstance(stop_reason, str):
            seq.detokenizer.flush()
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.scheduler.remove(seq)

    # --- outputs ---

    def _collect_outputs(self, sampled: list[Sequence]) -> list[RequestOutput]:
        by_request: dict[str, list[Sequence]] = {}
        for seq in sampled:
            by_request.setdefault(seq.request.request_id, []).append(seq)
        outputs = []
        for request_id, seqs in by_request.items():
            request = self.requests[request_id]
            outputs.append(self._output(request, seqs))
            if request.is_finished:
                del self.requests[request_id]
        return outputs

    def _output(self, request: Request, seqs: list[Sequence]) -> RequestOutput:
        if request.is_finished and request.metrics.finished_time is None:
            request.metrics.finished_time = time.monotonic()
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[self._delta(seq) for seq in sorted(seqs, key=lambda s: s.index)],
            finished=request.is_finished,
            metrics=request.metrics,
            num_cached_tokens=request.num_cached_tokens,
        )

    def _delta(self, seq: Sequence) -> CompletionOutput:
        """What ``seq`` produced since it was last reported."""
        output_ids = seq.output_token_ids
        new_ids = output_ids[seq.num_emitted_tokens :]
        seq.num_emitted_tokens = len(output_ids)
        new_logprobs, cumulative = None, None
        if seq.request.params.logprobs is not None:
            new_logprobs = seq.logprobs[seq.num_emitted_logprobs :]
            seq.num_emitted_logprobs = len(seq.logprobs)
            cumulative = seq.cumulative_logprob
        return CompletionOutput(
            index=seq.index,
            text=seq.detokenizer.take_new_text(seq.is_finished),
            token_ids=new_ids,
            cumulative_logprob=cumulative,
            logprobs=new_logprobs,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )

    # --- observability ---

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.block_manager.usage,
            num_preemptions=self.scheduler.num_preemptions,
            num_generated_tokens=self.num_generated_tokens,
        )
