"""A worker of an embedding model (``pagedq worker --model NAME`` for a model of kind embed: worker/main.py
serves it with ``embedding``): the generation worker's roles (claimer, flusher, heartbeat, reconciler:
worker/host.py, worker/main.py) around an ``EmbeddingEngine``, so an embedding job is claimed by attempt,
its result written on that attempt's condition, its message acknowledged late, and requeued when its
worker dies, exactly as a generation job. Only the engine loop's three engine-facing steps differ: a job's
inputs go in (worker/embedding_jobs.py), its vectors come out whole, and nothing is streamed.
"""

from typing import Any

from contract.engine import EngineConfig
from contract.pooling import EmbeddingParams
from core.states import JobStatus
from core.timings import ms
from worker.embedding_jobs import JobEmbedder, JobEmbedding
from worker.engine.embedding_engine import EmbeddingEngine
from worker.engine_loop import EngineLoop
from worker.flights import Flight
from worker.host import EngineKind
from worker.results import EmbeddingResult

PARAMS = ("truncate_prompt_tokens", "dimensions")  # what of a job's params the engine takes


class EmbeddingLoop(EngineLoop[JobEmbedder]):
    def _add_request(self, flight: Flight) -> None:
        job = flight.job
        params = EmbeddingParams(**{name: job.params.get(name) for name in PARAMS})
        self.engine.add_request(flight.request_id, job.prompt_token_ids, params, job.priority)  # type: ignore[arg-type]

    def _record(self, output: JobEmbedding) -> None:  # type: ignore[override]
        flight = self.flights.held(output.request_id.rpartition("#")[0])
        if flight is None or flight.request_id != output.request_id:  # a run we let go (its abort, say)
            return
        self.flights.fold(flight, output, str)
        if output.error is None:
            self.flights.end(flight, JobStatus.SUCCEEDED, finish_reason="stop")
        elif flight.abort_as is not None:
            self.flights.end(flight, flight.abort_as, finish_reason="abort")
        else:
            self.flights.end(flight, JobStatus.FAILED, error=f"rejected by the engine: {output.error}")

    def _update_stats(self) -> None:
        stats = self.engine.stats()
        self._stats = {
            "num_running": stats.num_running,
            "num_waiting": stats.num_waiting,
            "num_embedded_tokens": stats.num_embedded_tokens,
            "busy_ms": ms(stats.busy_time * 1000),
        }


def embedding(engine_config: EngineConfig) -> EngineKind:
    """A worker of an embedding model: a ``JobEmbedder`` around an ``EmbeddingEngine`` of
    ``engine_config``."""
    build = lambda: JobEmbedder(EmbeddingEngine(engine_config))  # noqa: E731
    return EngineKind(
        lambda flights, _: EmbeddingLoop(build, flights), EmbeddingResult.claimed, facts, streams=False
    )


def facts(embedder: JobEmbedder) -> dict[str, Any]:
    engine = embedder.engine
    pooling = engine.pooling
    return {
        "device": str(engine.runner.device),
        "dtype": str(engine.runner.dtype).removeprefix("torch."),
        "pooling": pooling.mode,
        "normalized": pooling.normalize,
        "max_model_len": pooling.max_seq_length,  # the longest input it embeds (pagedq up's "context")
        "dimensions": pooling.hidden_size,
        "weights": engine.runner.weights.as_json(),
    }
