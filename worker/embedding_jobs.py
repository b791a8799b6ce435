"""An embedding job's inputs through the ``EmbeddingEngine``: a job is one request per input, and its
output comes once every input's step has run (or one failed).

The worker's engine loop drives this as it drives ``LLMEngine`` (``add_request`` / ``step`` / ``abort``):
a job's inputs batch with every other job's in the engine's steps, by its token budget. Each step's wall
time is split over the inputs it ran by their tokens, as ``LLMEngine`` charges a generation step, and a
job's share is the sum of its inputs' (``usage.engine_ms``).
"""

import time
from dataclasses import dataclass, field

from contract.pooling import EmbeddingParams
from worker.engine.embedding_engine import EmbeddingEngine
from worker.engine.outputs import EmbeddingOutput


@dataclass
class JobEmbedding:
    """A job's vectors (one per input, in order), or why it failed; from ``JobEmbedder.step``."""

    request_id: str
    vectors: list[list[float]]
    num_tokens: int
    engine_time: float  # seconds: its share of the steps that ran its inputs
    finished_time: float  # monotonic
    error: str | None = None


@dataclass
class _Job:
    vectors: list[list[float] | None]
    num_tokens: int = 0
    engine_time: float = 0.0
    error: str | None = None


@dataclass
class EmbeddingStats:
    num_running: int  # jobs with inputs in the engine
    num_waiting: int  # inputs not embedded yet
    num_embedded_tokens: int
    busy_time: float


@dataclass
class JobEmbedder:
    engine: EmbeddingEngine
    jobs: dict[str, _Job] = field(default_factory=dict)
    busy_time: float = 0.0

    def add_request(
        self, request_id: str, inputs: list[list[int]], params: EmbeddingParams, priority: int
    ) -> None:
        """Queue a job's inputs (token ids, embedded as they are); raises ValueError for what can never
        be embedded, leaving none of them queued."""
        if not inputs:
            raise ValueError("the job has no inputs")
        if request_id in self.jobs:
            raise ValueError(f"request {request_id!r} already exists")
        added = []
        try:
            for i, token_ids in enumerate(inputs):
                self.engine.add_request(f"{request_id}/{i}", token_ids, params, priority)
                added.append(f"{request_id}/{i}")
        except ValueError:
            for input_id in added:  # their aborts come out of a later step, to no job
                self.engine.abort(input_id)
            raise
        self.jobs[request_id] = _Job([None] * len(inputs))

    def abort(self, request_id: str) -> bool:
        """Drop a job's inputs still waiting; its output (failed, ``aborted``) comes from a later step."""
        job = self.jobs.get(request_id)
        if job is None:
            return False
        for i, vector in enumerate(job.vectors):
            if vector is None:
                self.engine.abort(f"{request_id}/{i}")
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.jobs) or self.engine.has_unfinished_requests()

    def step(self) -> list[JobEmbedding]:
        start = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception:  # the loop fails every run in flight: none of their inputs will come out
            self.jobs.clear()
            raise
        took = time.monotonic() - start
        tokens = sum(output.num_tokens for output in outputs if output.error is None)
        if tokens:
            self.busy_time += took
        done: list[JobEmbedding] = []
        for output in outputs:
            self._fold(output, took * output.num_tokens / tokens if tokens else 0.0)
        for request_id in [r for r, job in self.jobs.items() if None not in job.vectors]:  # all came out
            done.append(self._output(request_id, self.jobs.pop(request_id)))
        return done

    def _fold(self, output: EmbeddingOutput, share: float) -> None:
        request_id, _, index = output.request_id.rpartition("/")
        job = self.jobs.get(request_id)
        if job is None:  # an input of a job that failed and was let go
            return
        if output.error is not None:
            job.error = job.error or output.error
            job.vectors[int(index)] = []
            return
        job.vectors[int(index)] = output.embedding
        job.num_tokens += output.num_tokens
        job.engine_time += share

    @staticmethod
    def _output(request_id: str, job: _Job) -> JobEmbedding:
        vectors = [] if job.error else [vector for vector in job.vectors if vector is not None]
        return JobEmbedding(request_id, vectors, job.num_tokens, job.engine_time, time.monotonic(), job.error)

    def stats(self) -> EmbeddingStats:
        engine = self.engine.stats()
        return EmbeddingStats(len(self.jobs), engine.num_waiting, engine.num_embedded_tokens, self.busy_time)
