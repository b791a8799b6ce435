"""One engine, many jobs: the worker's three roles around one registry, started and stopped in order.

Celery hands each job's message to a thread of its pool, which runs the claimer (worker/claimer.py) and
blocks until the job's result is committed; meanwhile the jobs of all those threads batch together in the
one engine, stepped by the engine loop (worker/engine_loop.py) on its own thread. The flusher
(worker/flusher.py) is the only one that writes runs; the engine thread never touches the database, so a
slow write never stalls a decode step. They share what the worker holds through worker/flights.py. The
heartbeat (worker/heartbeat.py) beats on a thread and a connection of its own.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.claimer import Claimer, RunResult
from worker.connectivity import Connectivity
from worker.engine_loop import EngineLoop
from worker.flights import Flights
from worker.flusher import Flusher
from worker.health import WorkerHealth
from worker.heartbeat import Heartbeat
from worker.results import EmbeddingResult, JobResult
from worker.store import ClaimedJob
from worker.streamer import TokenStreamer


@dataclass(frozen=True)
class EngineKind:
    """What differs between a generation worker and an embedding worker (worker/embedding_host.py)."""

    make_loop: Callable[[Flights, TokenStreamer | None], EngineLoop[Any]]
    result_of: Callable[[ClaimedJob, float], JobResult | EmbeddingResult]  # a claimed run's, from its claim
    facts: Callable[[Any], dict[str, Any]]  # the engine's, for the ready line
    streams: bool = True  # whether runs' text goes to Redis streams
    identity: Callable[[Any], dict[str, Any]] | None = None  # what serves its runs, for manifests


@dataclass
class EngineHost:
    claimer: Claimer
    loop: EngineLoop[Any]  # of an LLMEngine, or of an embedding engine (worker/embedding_host.py)
    flusher: Flusher
    heartbeat: Heartbeat
    health: WorkerHealth

    @property
    def connectivity(self) -> Connectivity:
        return self.heartbeat.connectivity

    def start(self) -> None:
        """The engine is built before the first flush and heartbeat: a worker that cannot build it never
        registers."""
        self.health.write()
        self.loop.start()
        self.heartbeat.start()
        self.flusher.start()

    def run(self, job_id: str) -> RunResult:
        """Claim a job for a pool thread's message and block until its end is written."""
        return self.claimer.run(job_id)

    def drain(self, grace: float) -> None:
        self.flusher.begin_drain(grace)

    def stop(self) -> None:
        """Requeue whatever still runs and write what is unwritten, then stop the flusher, leave the workers
        table, then stop the engine (the requeued runs' aborts are stepped out meanwhile, or not at all)."""
        self.flusher.stop()
        self.heartbeat.stop()
        self.loop.stop()
