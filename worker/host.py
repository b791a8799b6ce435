"""One engine, many jobs: the engine thread steps the engine; the flusher thread talks to the database.

Celery hands each job to a thread of its pool, which calls ``EngineHost.run`` and blocks until the job's
result is committed; meanwhile the jobs of all those threads batch together in the one engine. The
engine thread never touches the database, so a slow write never stalls a decode step.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from core.states import JobStatus
from worker.engine import LLMEngine, RequestOutput, SamplingParams
from worker.results import Clock, JobResult
from worker.store import ClaimedJob, JobStore, Progress
from worker.streamer import TokenStreamer

logger = logging.getLogger("pagedq.worker")

Publish = Callable[[str, int], None]  # (job id, priority): put a job back on the broker


class RunResult(Enum):
    FINISHED = "finished"  # the final state is committed
    SKIPPED = "skipped"  # the job was not queued (finished, cancelled, or another run owns it)
    REFUSED = "refused"  # the worker is shutting down; the message should go back to the broker


@dataclass
class Flight:
    """A job in the engine: what it produced so far, and how its run ends."""

    job: ClaimedJob
    result: JobResult
    done: threading.Event = field(default_factory=threading.Event)
    final: JobStatus | None = None
    finish_reason: str | None = None
    error: str | None = None
    abort_as: JobStatus | None = None  # why we aborted it: CANCELLED, or QUEUED to requeue it
    dirty: bool = True


class EngineHost:
    def __init__(
        self,
        build_engine: Callable[[], LLMEngine],
        store: JobStore,
        publish: Publish,
        worker_id: str,
        flush_interval: float,
        heartbeat_interval: float,
        streamer: TokenStreamer | None = None,
    ) -> None:
        self.build_engine, self.store, self.publish = build_engine, store, publish
        self.engine: LLMEngine  # built, and only ever used, on the engine thread
        self.engine_ready = threading.Event()
        self.engine_error: BaseException | None = None
        self.worker_id, self.flush_interval = worker_id, flush_interval
        self.heartbeat_interval = heartbeat_interval  # checked at each flush
        self.streamer = streamer
        self.flights: dict[str, Flight] = {}
        self.lock = threading.Lock()
        self.commands: queue.Queue[tuple[str, Flight]] = queue.Queue()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.drain_deadline: float | None = None
        self.stats: dict[str, float] = {}
        self.peak_running = 0
        self.clock = Clock()
        self.token_texts: dict[int, str] = {}
        self._threads = [
            threading.Thread(target=self._engine_loop, name="pagedq-engine", daemon=True),
            threading.Thread(target=self._flush_loop, name="pagedq-flusher", daemon=True),
        ]

    # --- lifecycle ---

    def start(self) -> None:
        """Build the engine on the engine thread, where it will run, then start flushing.

        On CPU this matters: OpenMP keeps a thread team per thread that runs parallel ops, and once the
        process has more of those threads than cores its helpers sleep between ops instead of spinning
        (a decode step then took ~40% longer). So only the engine thread ever runs the model.
        """
        engine_thread, flusher = self._threads
        engine_thread.start()
        self.engine_ready.wait()
        if self.engine_error is not None:
            raise RuntimeError(f"the engine could not be built: {self.engine_error}") from self.engine_error
        self.store.heartbeat(self.worker_id, self._stats())
        flusher.start()

    def drain(self, grace: float) -> None:
        """Stop taking jobs; jobs still running after ``grace`` seconds are requeued."""
        logger.info("draining", extra={"grace_s": grace, "running_jobs": len(self.flights)})
        self.drain_deadline = time.monotonic() + grace
        self.wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Requeue whatever still runs, then stop both threads and leave the workers table."""
        self.drain(0.0)
        deadline = time.monotonic() + timeout
        while self.flights and time.monotonic() < deadline:
            time.sleep(0.05)
        self.stopping.set()
        self.wake.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.store.remove_worker(self.worker_id)

    # --- called from Celery's pool threads ---

    def run(self, job_id: str) -> RunResult:
        if self.drain_deadline is not None:
            return RunResult.REFUSED
        job = self.store.claim(job_id, self.worker_id)
        if job is None:
            logger.info("job not queued, skipping", extra={"job_id": job_id})
            return RunResult.SKIPPED
        flight = Flight(job, JobResult.of(job.params))
        with self.lock:
            self.flights[job.id] = flight
        self.commands.put(("add", flight))
        flight.done.wait()
        return RunResult.FINISHED

    # --- the engine thread ---

    def _engine_loop(self) -> None:
        try:
            self.engine = self.build_engine()
        except BaseException as error:  # start() re-raises it in the main thread
            self.engine_error = error
            return
        finally:
            self.engine_ready.set()
        while not self.stopping.is_set():
            self._take_commands(block=not self.engine.has_unfinished_requests())
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as error:  # a broken step fails its jobs rather than hanging them
                logger.exception("engine step failed")
                self._fail_all(f"engine step failed: {error!r}")
                continue
            for output in outputs:
                self._record(output)
            self._update_stats()

    def _take_commands(self, block: bool) -> None:
        try:
            command, flight = self.commands.get(timeout=0.1) if block else self.commands.get_nowait()
            while True:
                self._apply(command, flight)
                command, flight = self.commands.get_nowait()
        except queue.Empty:
            return

    def _apply(self, command: str, flight: Flight) -> None:
        job = flight.job
        if command == "abort":
            self.engine.abort(job.id)
            return
        try:
            self.engine.add_request(job.id, job.prompt_token_ids, SamplingParams(**job.params), job.priority)
        except (ValueError, TypeError) as error:
            self._end(flight, JobStatus.FAILED, error=f"rejected by the engine: {error}")

    def _record(self, output: RequestOutput) -> None:
        flight = self.flights.get(output.request_id)
        if flight is None:
            return
        with self.lock:
            flight.result.fold(output, self._token_text)
            flight.dirty = True
        if self.streamer is not None and not flight.job.in_batch:
            text = "".join(sample.text for sample in output.outputs if sample.index == 0)
            self.streamer.put(flight.job.id, flight.job.attempt, text, output.finished)
        if output.finished:
            reason = flight.result.choices[0].finish_reason
            status = flight.abort_as if reason == "abort" and flight.abort_as else JobStatus.SUCCEEDED
            self._end(flight, status, finish_reason=reason)

    def _token_text(self, token_id: int) -> str:
        """A token's text for its logprobs, cached: the engine's tokenizer, used only on this thread."""
        if (text := self.token_texts.get(token_id)) is None:
            text = self.token_texts[token_id] = self.engine.tokenizer.decode([token_id])
        return text

    def _end(
        self, flight: Flight, status: JobStatus, finish_reason: str | None = None, error: str | None = None
    ) -> None:
        with self.lock:
            flight.final, flight.finish_reason, flight.error = status, finish_reason, error
            flight.dirty = True
        self.wake.set()

    def _fail_all(self, error: str) -> None:
        with self.lock:
            flights = [f for f in self.flights.values() if f.final is None]
        for flight in flights:
            self.engine.abort(flight.job.id)
            self._end(flight, JobStatus.FAILED, error=error)
        self.engine.step()  # collects the aborts so the engine is empty again

    def _update_stats(self) -> None:
        stats = self.engine.stats()
        self.peak_running = max(self.peak_running, stats.num_running)
        self.stats = {
            "num_running": stats.num_running,
            "num_waiting": stats.num_waiting,
            "kv_cache_usage": stats.kv_cache_usage,
            "num_preemptions": stats.num_preemptions,
            "num_generated_tokens": stats.num_generated_tokens,
            "peak_running": self.peak_running,
        }

    # --- the flusher thread ---

    def _flush_loop(self) -> None:
        last_tokens, last_time = 0.0, time.monotonic()
        while not (self.stopping.is_set() and not self.flights):
            self.wake.wait(self.flush_interval)
            self.wake.clear()
            try:
                self._flush()
                self._poll_cancellations()
                self._enforce_drain_deadline()
                now, tokens = time.monotonic(), self.stats.get("num_generated_tokens", 0.0)
                if now - last_time >= self.heartbeat_interval:
                    rate = (tokens - last_tokens) / (now - last_time)
                    self.store.heartbeat(self.worker_id, self._stats() | {"tokens_per_s": rate})
                    last_tokens, last_time = tokens, now
            except Exception:  # the database may be briefly away; keep the jobs and try again
                logger.exception("flush failed; retrying")
                time.sleep(self.flush_interval)

    def _stats(self) -> dict[str, float]:
        return dict(self.stats) or {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}

    def _flush(self) -> None:
        with self.lock:
            due = [f for f in self.flights.values() if f.dirty]
            snapshot = [self._progress(f) for f in due]
            for f in due:
                f.dirty = False
        requeues = [p for p in snapshot if p.status == JobStatus.QUEUED]
        writes = [p for p in snapshot if p.status != JobStatus.QUEUED]
        lost = self.store.write(writes) if writes else set()
        self._written(writes, lost)
        for p in requeues:
            priority = self.store.requeue(p.job_id, p.attempt)
            if priority is not None:
                self.publish(p.job_id, priority)
        for p in snapshot:
            if p.status is not None or p.job_id in lost:
                self._release(p.job_id, lost=p.job_id in lost and p.status is None)

    def _progress(self, flight: Flight) -> Progress:
        job = flight.job
        return flight.result.progress(
            job.id, job.attempt, self.clock, flight.final, flight.finish_reason, flight.error
        )

    def _written(self, writes: list[Progress], lost: set[str]) -> None:
        with self.lock:
            for p in writes:
                if p.job_id not in lost and (flight := self.flights.get(p.job_id)) is not None:
                    flight.result.written(p)

    def _release(self, job_id: str, lost: bool) -> None:
        with self.lock:
            flight = self.flights.pop(job_id)
        if lost:  # another run owns the job now (we were presumed dead) or it was deleted
            logger.warning("job no longer ours; aborting", extra={"job_id": job_id})
            self.commands.put(("abort", flight))
        flight.done.set()

    def _poll_cancellations(self) -> None:
        with self.lock:
            running = [f.job.id for f in self.flights.values() if f.final is None and f.abort_as is None]
        if running:
            for job_id in self.store.cancel_requested(running):
                self._abort(job_id, JobStatus.CANCELLED)

    def _enforce_drain_deadline(self) -> None:
        if self.drain_deadline is None or time.monotonic() < self.drain_deadline:
            return
        with self.lock:
            running = [f.job.id for f in self.flights.values() if f.final is None and f.abort_as is None]
        for job_id in running:
            self._abort(job_id, JobStatus.QUEUED)

    def _abort(self, job_id: str, abort_as: JobStatus) -> None:
        with self.lock:
            flight = self.flights.get(job_id)
            if flight is None or flight.abort_as is not None:
                return
            flight.abort_as = abort_as
        logger.info("aborting job", extra={"job_id": job_id, "as": abort_as.value})
        self.commands.put(("abort", flight))
