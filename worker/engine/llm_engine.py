"""The step-level engine: add requests, run one scheduling step at a time, hand out what is new."""

import copy
import logging
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from contract.context import context_problem, max_model_len, step_problem
from contract.engine import EngineConfig
from contract.sampling import SamplingParams, new_seed
from worker.engine.beam_search import BeamSearcher
from worker.engine.block_manager import BlockManager
from worker.engine.default_model import resolve_model
from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.grammar import Grammars
from worker.engine.model.model_config import ModelConfig
from worker.engine.model_runner import ModelRunner, resolve_device
from worker.engine.outputs import RequestOutput
from worker.engine.sampler import Sampler, SamplingRow
from worker.engine.scheduler import ScheduledBatch, Scheduler
from worker.engine.sequence import Request, Sequence, by_request

logger = logging.getLogger("pagedq.engine")


def eos_token_ids(model_config: ModelConfig, path: object) -> list[int]:
    """The model's end-of-sequence ids: its config's and its generation_config.json's."""
    ids = set(model_config.eos_token_ids)
    try:
        eos = GenerationConfig.from_pretrained(path).eos_token_id
    except OSError:
        eos = None
    ids.update([eos] if isinstance(eos, int) else eos or [])
    return sorted(ids)


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of blocks in use
    num_preemptions: int
    num_generated_tokens: int  # since the engine started
    busy_time: float = 0.0  # seconds spent in steps that ran the model, since the engine started


def resume_problem(resumed: list[int], params: SamplingParams, vocab_size: int) -> str | None:
    """Why a request cannot continue from ``resumed`` (an earlier run's output tokens), or None."""
    if params.num_sequences > 1 or params.use_beam_search or params.logprobs is not None:
        return "only a single sample without logprobs continues from earlier tokens"
    if max(resumed) >= vocab_size or min(resumed) < 0:
        return f"token ids must be in [0, {vocab_size})"
    return None


@dataclass
class LLMEngine:
    config: EngineConfig
    requests: dict[str, Request] = field(default_factory=dict)
    finished_outside_step: list[RequestOutput] = field(default_factory=list)  # aborts
    compiling: list[Request] = field(default_factory=list)  # waiting for their constraint to compile
    num_generated_tokens: int = 0
    busy_time: float = 0.0  # the sum of the steps' wall times; the requests' engine_time add up to it

    def __post_init__(self) -> None:
        on_gpu = resolve_device(self.config.device).type == "cuda"
        self.config = replace(self.config, max_num_batched_tokens=self.config.step_budget(on_gpu))
        path = self.model_path = resolve_model(self.config.model, gguf=self.config.quantization == "gguf")
        self.model_config = ModelConfig.from_pretrained(path)
        self.max_model_len = max_model_len(self.model_config.hf_config.to_dict(), self.config.max_model_len)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
        self.eos_token_ids = eos_token_ids(self.model_config, path)
        self.runner = ModelRunner(self.config, self.model_config, self.max_model_len)
        block_manager = BlockManager(
            self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching
        )
        self.scheduler = Scheduler(self.config, block_manager, self.config.step_context_keys(on_gpu))
        self.beam_searcher = BeamSearcher(
            self.scheduler, self._new_sequence, self.tokenizer, self.eos_token_ids, self.max_model_len
        )
        self.sampler = Sampler()
        self.grammars = Grammars(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        logger.info(
            "engine ready: %s on %s (%s), max_model_len %d",
            path,
            self.runner.device,
            self.runner.dtype,
            self.max_model_len,
        )

    # --- requests in ---

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        priority: int = 0,
        continue_from: list[int] | None = None,
    ) -> None:
        """Queue a request. Raises ValueError at once when it can never be served.

        ``continue_from``: output tokens an earlier run of the same request produced (a resume after a
        crash). The request goes on from them as if it had generated them: they are prefilled with the
        prompt, its constraint consumes them, its stop rules see them, and its outputs report only what
        comes after them. With the same seed, what follows is what the earlier run would have produced.
        A single sample only (not n > 1, beam search or logprobs, whose earlier state is not kept)."""
        params = params or SamplingParams()
        if params.seed is None:  # every request samples from a seed, reported in its outputs for replays
            params = copy.copy(params)  # not the caller's; replace() would validate it again
            params.seed = new_seed()
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} already exists")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_fits(request_id, token_ids, params)
        resumed = list(continue_from or [])
        if resumed and (problem := resume_problem(resumed, params, self.model_config.vocab_size)):
            raise ValueError(f"request {request_id!r}: {problem}")
        request = Request(
            request_id, prompt if isinstance(prompt, str) else None, token_ids, params, priority
        )
        request.resumed = resumed
        request.sequences.append(self._new_sequence(request, 0))
        self.requests[request_id] = request
        if params.structured is None:
            self._start(request)
            return
        request.grammar = self.grammars.compile(params.structured)
        request.compile_deadline = time.monotonic() + self.config.grammar_compile_timeout
        self.compiling.append(request)

    def _start(self, request: Request) -> RequestOutput | None:
        """Schedule a request's first sequence, advanced over its earlier run's tokens if it continues one.
        Returns its failed output if its constraint refuses those tokens."""
        seq = request.sequences[0]
        if request.resumed:
            request.forked = True  # one sample: nothing to fork
            for token in request.resumed:
                if seq.matcher and (error := seq.matcher.accept(token)):
                    return self._fail(request, error)
                seq.token_ids.append(token)
                if (reason := self._stop_reason(seq, token)) is not None:
                    self._finish(seq, *reason)
                    break
            # What the earlier run reported of these tokens is not reported again.
            seq.num_emitted_tokens = seq.num_output_tokens
            seq.detokenizer.take_new_text(seq.is_finished)
            if seq.is_finished:  # it had ended, its end unwritten: it ends at the next step
                self.finished_outside_step.append(self._output(request, [seq]))
                self.requests.pop(request.request_id, None)
                return None
        self.scheduler.add(seq)
        return None

    def _check_fits(self, request_id: str, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError(f"request {request_id!r}: the prompt is empty")
        if max(token_ids) >= self.model_config.vocab_size or min(token_ids) < 0:
            raise ValueError(
                f"request {request_id!r}: token ids must be in [0, {self.model_config.vocab_size})"
            )
        if problem := context_problem(len(token_ids), params.max_tokens, self.max_model_len):
            raise ValueError(f"request {request_id!r}: {problem}")
        if step := step_problem(params.num_sequences, params.use_beam_search, self.config):
            raise ValueError(f"request {request_id!r}: {step}")
        total = len(token_ids) + params.max_tokens
        pool_tokens = self.runner.num_blocks * self.config.block_size
        if total > pool_tokens:
            raise ValueError(
                f"request {request_id!r}: needs {total} tokens of KV cache but the whole pool holds "
                f"{pool_tokens}"
            )

    def _new_sequence(self, request: Request, index: int, token_ids: list[int] | None = None) -> Sequence:
        seq = Sequence(request, index, list(token_ids or request.prompt_token_ids))
        seq.detokenizer = IncrementalDetokenizer(
            self.tokenizer.backend_tokenizer, request.prompt_token_ids, request.params
        )
        return seq

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its final output comes from the next step()."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        if request in self.compiling:
            self.compiling.remove(request)
        self.beam_searcher.drop(request_id)
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
        outputs += self._admit_compiled()
        started = time.monotonic()
        batch = self.scheduler.schedule()
        if not batch.sequences:
            return outputs
        now = time.monotonic()
        for seq in batch.sequences:
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = now
        logits = self.runner.execute(batch)
        due = list(enumerate(self.scheduler.advance(batch)))
        beams = [(row, seq) for row, seq in due if seq.request.params.use_beam_search]
        rows = self._fork_new_samples(
            [(row, seq) for row, seq in due if not seq.request.params.use_beam_search]
        )
        self.num_generated_tokens += len(beams) + len(rows)
        new = self.beam_searcher.step(beams, logits) + self._sample(rows, logits)
        self._charge(batch, new, time.monotonic() - started)
        for output in new:
            if output.finished:
                self.requests.pop(output.request_id, None)  # a failed one is gone already
        return outputs + new

    def _charge(self, batch: ScheduledBatch, new: list[RequestOutput], wall: float) -> None:
        """Split a step's wall time over its requests by the tokens each computed, and stamp the total so
        far on this step's outputs (made before the step's time was known)."""
        self.busy_time += wall
        tokens: dict[Request, int] = {}
        for seq, num_new in zip(batch.sequences, batch.num_new_tokens, strict=True):
            tokens[seq.request] = tokens.get(seq.request, 0) + num_new
        total = sum(tokens.values()) or 1
        for request, count in tokens.items():
            request.metrics.engine_time += wall * count / total
        charged = {request.request_id: request.metrics.engine_time for request in tokens}
        for output in new:
            output.metrics.engine_time = charged.get(output.request_id, output.metrics.engine_time)

    def _admit_compiled(self) -> list[RequestOutput]:
        """Schedule the requests whose constraint has compiled; fail those whose constraint failed or
        ran out of time. With nothing else to run, first wait a little for a compile to end."""
        if not self.compiling:
            return []
        if not self.scheduler.running and not self.scheduler.waiting:
            wait([r.grammar for r in self.compiling if r.grammar], timeout=0.05, return_when=FIRST_COMPLETED)
        still, failed = [], []
        for request in self.compiling:
            future = request.grammar
            assert future is not None
            if future.done() and future.exception() is None:
                request.sequences[0].matcher = future.result().fork()
                if (refused := self._start(request)) is not None:
                    failed.append(refused)
            elif future.done() or time.monotonic() > request.compile_deadline:
                timeout = self.config.grammar_compile_timeout
                late = f"the structured-output constraint took over {timeout:g} s to compile"
                failed.append(self._fail(request, str(future.exception()) if future.done() else late))
            else:
                still.append(request)
        self.compiling = still
        return failed

    def _fail(self, request: Request, error: str) -> RequestOutput:
        logger.warning("request failed: %s", error, extra={"request_id": request.request_id})
        del self.requests[request.request_id]
        request.error, request.forked = error, True
        for seq in request.sequences:
            if not seq.is_finished:
                self._finish(seq, "abort")
        return self._output(request, request.sequences)

    def _fork_new_samples(self, due: list[tuple[int, Sequence]]) -> list[tuple[int, Sequence]]:
        """Split a request's n samples off its first sequence once its prompt is computed. Takes and
        returns (logits row, sequence) pairs: the samples of one request share the prompt's row."""
        rows = []
        for row, seq in due:
            rows.append((row, seq))
            request = seq.request
            if request.forked:
                continue
            request.forked = True
            for index in range(1, request.params.n):
                child = self._new_sequence(request, index, seq.token_ids)
                child.matcher = seq.matcher.fork() if seq.matcher else None
                self.scheduler.fork(seq, child)
                request.sequences.append(child)
                rows.append((row, child))
        return rows

    def _sample(self, rows: list[tuple[int, Sequence]], logits: torch.Tensor) -> list[RequestOutput]:
        """Sample the next token of each (logits row, sequence); returns the outputs of their requests."""
        if not rows:
            return []
        row_ids = [row for row, _ in rows]
        if row_ids != list(range(len(logits))):
            logits = logits[torch.tensor(row_ids, device=logits.device)]
        matchers = [(i, seq.matcher) for i, (_, seq) in enumerate(rows) if seq.matcher]
        masks = None
        if matchers:
            masks = ([i for i, _ in matchers], self.grammars.fill_bitmask([m for _, m in matchers]))
        sampled = self.sampler(logits, [self._sampling_row(seq) for _, seq in rows], masks)
        now = time.monotonic()
        broken: dict[Request, str] = {}
        for i, (_, seq) in enumerate(rows):
            token = sampled.token_ids[i]
            if seq.matcher and (error := seq.matcher.error or seq.matcher.accept(token)):
                broken.setdefault(seq.request, error)  # never sample on unconstrained
                continue
            self._append_token(seq, token, sampled.logprobs[i], sampled.top_logprobs[i], now)
        failed = [self._fail(request, error) for request, error in broken.items()]
        grouped = by_request(seq for _, seq in rows if seq.request not in broken)
        return failed + [self._output(request, seqs) for request, seqs in grouped.items()]

    def _sampling_row(self, seq: Sequence) -> SamplingRow:
        request = seq.request
        seed = request.params.seed
        assert seed is not None  # add_request chose one
        return SamplingRow(
            request.params,
            seed,
            request.prompt_token_ids,
            seq.output_token_ids,
            self.eos_token_ids,
            seq.index,
        )

    def _append_token(
        self, seq: Sequence, token: int, logprob: float | None, top: dict | None, now: float
    ) -> None:
        seq.token_ids.append(token)
        if logprob is not None and top is not None:
            seq.cumulative_logprob += logprob
            seq.logprobs.append(top)
        if seq.index == 0:
            seq.request.metrics.record_token(now)
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
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None

    def _finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        if not isinstance(stop_reason, str):
            seq.detokenizer.flush()
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self.scheduler.finish(seq)

    def _output(self, request: Request, seqs: list[Sequence]) -> RequestOutput:
        return request.output([seq.take_output() for seq in sorted(seqs, key=lambda s: s.index)])

    # --- observability ---

    def cached_prefixes(self, keys: Iterable[int]) -> list[int]:
        """Those of ``keys`` (contract/prefix.py: chained block hashes) whose block the prefix cache holds."""
        cached = self.scheduler.block_manager.cached
        return [key for key in keys if key in cached]

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.scheduler.kv_cache_usage,
            num_preemptions=self.scheduler.num_preemptions,
            num_generated_tokens=self.num_generated_tokens,
            busy_time=self.busy_time,
        )
