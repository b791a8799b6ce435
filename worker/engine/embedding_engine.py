"""The embedding engine: add requests, run one batch per step, hand out each request's vector.

The same shape as ``LLMEngine`` (``add_request`` / ``step`` / ``abort`` / ``has_unfinished_requests``), so
a worker drives either the same way; an embedding request is done in the one step that runs it. A step
takes waiting requests by (priority, arrival) while the token budget (``max_num_batched_tokens``) and
seats (``max_num_seqs``) last, packs their tokens without padding, longest first (inputs of equal length
share one attention call), runs the model once and pools (``pooling.py``).
"""

import heapq
import itertools
import logging
import time
from dataclasses import dataclass, field, replace

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from contract.engine import EMBED_MAX_NUM_BATCHED_TOKENS, EngineConfig
from contract.pooling import EmbeddingParams, PoolingMode, token_limit
from worker.engine.default_model import resolve_model
from worker.engine.embedding_runner import make_runner
from worker.engine.model.model_config import ModelConfig
from worker.engine.outputs import EmbeddingOutput, RequestMetrics
from worker.engine.pooling import finish, pool, read_pooling

logger = logging.getLogger("pagedq.engine")

ENCODERS = {"bert"}


@dataclass(order=True)
class EmbeddingRequest:
    priority: int
    arrival: int  # the engine's counter: ties in priority run in arrival order
    request_id: str = field(compare=False)
    token_ids: list[int] = field(compare=False)
    params: EmbeddingParams = field(compare=False)
    metrics: RequestMetrics = field(compare=False)


@dataclass
class EmbeddingStats:
    num_waiting: int
    num_embedded_tokens: int  # since the engine started


class EmbeddingEngine:
    def __init__(self, config: EngineConfig) -> None:
        budget = config.max_num_batched_tokens or EMBED_MAX_NUM_BATCHED_TOKENS
        self.config = replace(config, max_num_batched_tokens=budget)
        path = resolve_model(config.model)
        hf_config = AutoConfig.from_pretrained(path)
        encoder = hf_config.model_type in ENCODERS
        model_config = ModelConfig(hf_config, path) if encoder else ModelConfig.from_pretrained(path)
        default_mode: PoolingMode = "cls" if encoder else "last"
        self.pooling = read_pooling(path, hf_config.to_dict(), default_mode)
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(path)
        self.vocab_size = hf_config.vocab_size
        self.runner = make_runner(config, model_config)
        self.waiting: list[EmbeddingRequest] = []  # a heap
        self.requests: dict[str, EmbeddingRequest] = {}
        self.aborted: list[EmbeddingOutput] = []
        self.num_embedded_tokens = 0
        self._arrivals = itertools.count()
        logger.info(
            "embedding engine ready: %s on %s (%s), %s pooling%s, max_seq_length %d",
            path,
            self.runner.device,
            self.runner.dtype,
            self.pooling.mode,
            ", normalized" if self.pooling.normalize else "",
            self.pooling.max_seq_length,
        )

    # --- requests in ---

    def encode(self, texts: list[str], params: EmbeddingParams | None = None) -> list[list[int]]:
        """The token ids each text is embedded as: special tokens added, truncated to the limit (as
        sentence-transformers tokenizes). One call tokenizes many texts in parallel."""
        limit = token_limit(params or EmbeddingParams(), self.pooling)
        if empty := [i for i, text in enumerate(texts) if not isinstance(text, str) or not text]:
            raise ValueError(f"input {empty[0]} is {'empty' if texts[empty[0]] == '' else 'not a string'}")
        special = self.tokenizer.num_special_tokens_to_add()
        if limit <= special:  # the tokenizer cannot truncate below its special tokens: cut the ids
            return [ids[:limit] for ids in self.tokenizer(texts)["input_ids"]]
        return self.tokenizer(texts, truncation=True, max_length=limit)["input_ids"]

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: EmbeddingParams | None = None,
        priority: int = 0,
    ) -> None:
        """Queue one input: a text, or token ids embedded as they are (no special tokens added), cut to
        the limit. Raises ValueError at once for what can never be embedded."""
        params = params or EmbeddingParams()
        params.check(self.pooling)
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} already exists")
        if isinstance(prompt, str):
            token_ids = self.encode([prompt], params)[0]
        else:
            token_ids = self._checked_ids(request_id, prompt)[: token_limit(params, self.pooling)]
        metrics = RequestMetrics(arrival_time=time.monotonic())
        request = EmbeddingRequest(priority, next(self._arrivals), request_id, token_ids, params, metrics)
        self.requests[request_id] = request
        heapq.heappush(self.waiting, request)

    def _checked_ids(self, request_id: str, token_ids: list[int]) -> list[int]:
        if not token_ids:
            raise ValueError(f"request {request_id!r}: the input is empty")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in token_ids):
            raise ValueError(f"request {request_id!r}: token ids must be integers in [0, {self.vocab_size})")
        return list(token_ids)

    def abort(self, request_id: str) -> bool:
        """Drop a waiting request; its output (with ``error``) comes from the next step()."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        self.waiting.remove(request)
        heapq.heapify(self.waiting)
        request.metrics.finished_time = time.monotonic()
        self.aborted.append(EmbeddingOutput(request_id, [], 0, request.metrics, error="aborted"))
        return True

    # --- one step ---

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests or self.aborted)

    def step(self) -> list[EmbeddingOutput]:
        outputs, self.aborted = self.aborted, []
        batch = self._schedule()
        if not batch:
            return outputs
        now = time.monotonic()
        for request in batch:
            request.metrics.first_scheduled_time = now
        vectors = self._embed([request.token_ids for request in batch], [r.params for r in batch])
        now = time.monotonic()
        for request, vector in zip(batch, vectors, strict=True):
            del self.requests[request.request_id]
            request.metrics.finished_time = now
            outputs.append(
                EmbeddingOutput(request.request_id, vector, len(request.token_ids), request.metrics)
            )
        self.num_embedded_tokens += sum(len(request.token_ids) for request in batch)
        return outputs

    def _schedule(self) -> list[EmbeddingRequest]:
        """The next requests by (priority, arrival) within the token budget and seats, longest first.
        The first always runs, however long (an input is at most max_seq_length tokens)."""
        batch: list[EmbeddingRequest] = []
        tokens = 0
        while self.waiting and len(batch) < self.config.max_num_seqs:
            size = len(self.waiting[0].token_ids)
            if batch and tokens + size > self.config.max_num_batched_tokens:
                break
            batch.append(heapq.heappop(self.waiting))
            tokens += size
        return sorted(batch, key=lambda request: len(request.token_ids), reverse=True)

    def _embed(self, inputs: list[list[int]], params: list[EmbeddingParams]) -> list[list[float]]:
        hidden = self.runner.run(inputs)
        pooled = pool(hidden, [len(ids) for ids in inputs], self.pooling.mode)
        vectors = []
        for dimensions, rows in itertools.groupby(range(len(inputs)), key=lambda i: params[i].dimensions):
            index = torch.tensor(list(rows), device=pooled.device)
            vectors += finish(pooled[index], self.pooling.normalize, dimensions).cpu().tolist()
        return vectors

    def stats(self) -> EmbeddingStats:
        return EmbeddingStats(num_waiting=len(self.waiting), num_embedded_tokens=self.num_embedded_tokens)
