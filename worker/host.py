"""One engine, many jobs: the engine thread steps the engine; the flusher thread talks to the database.

Celery hands each job to a thread of its pool, which calls ``EngineHost.run`` and blocks until the job's
result is committed; meanwhile the jobs of all those threads batch together in the one engine. The
engine thread never touches the database, so a slow write never stalls a decode step.

When the database is away, every write is kept and tried again (backing off) until it lands or the run
turns out to be lost to another worker; meanwhile the worker does not heartbeat and says it is unhealthy.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from sqlalchemy.exc import SQLAlchemyError

from core.states import JobStatus
from worker.engine import LLMEngine, RequestOutput, SamplingParams
from worker.health import WorkerHealth, describe
from worker.results import Clock, JobResult
from worker.store import ClaimedJob, JobStore, Progress, database_away
from worker.streamer import TokenStreamer

logger = logging.getLogger("pagedq.worker")

Publish = Callable[[str, int], None]  # (job id, priority): put a job back on the broker


class RunResult(Enum):
    FINISHED = "finished"  # the final state is committed
    SKIPPED = "skipped"  # the job was not queued (finished, cancelled, or another run owns it)
    REFUSED = "refused"  # the worker is shutting down; the message should go back to the broker
    UNWRITTEN = "unwritten"  # shut down before the result could be written; the message goes back too


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
    unwritten: bool = False  # given up at shutdown with its last state not written

    @property
    def request_id(self) -> str:
        """The engine's name for this run: the job's next run may join the engine before this one's
        abort has come out of it."""
        return f"{self.job.id}#{self.job.attempt}"


class EngineHost:
    def __init__(
        self,
        build_engine: Callable[[], LLMEngine],
        store: JobStore,
        publish: Publish,
        worker_id: str,
        flush_interval: float,
        heartbeat_interval: float,
        health: WorkerHealth,
        write_grace: float,
        streamer: TokenStreamer | None = None,
    ) -> None:
        self.build_engine, self.store, self.publish = build_engine, store, publish
        self.engine: LLMEngine  # built, and only ever used, on the engine thread
        self.engine_ready = threading.Event()
        self.engine_error: BaseException | None = None
        self.worker_id, self.flush_interval = worker_id, flush_interval
        self.heartbeat_interval = heartbeat_interval  # checked at each flush; also the longest retry delay
        self.health = health
        self.write_grace = write_grace  # after the drain deadline, how long unwritten writes are retried
        self.streamer = streamer
        self.flights: dict[str, Flight] = {}
        self.claiming: set[str] = set()  # job ids a pool thread is claiming right now (not the messages')
        self.lock = threading.Lock()
        self.commands: queue.Queue[tuple[str, Flight]] = queue.Queue()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.drain_deadline: float | None = None
        self.give_up_at: float | None = None  # unwritten runs are released, their messages go back
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
        self.health.write()
        engine_thread.start()
        self.engine_ready.wait()
        if self.engine_error is not None:
            raise RuntimeError(f"the engine could not be built: {self.engine_error}") from self.engine_error
        self.store.heartbeat(self.worker_id, self._stats())
        flusher.start()

    def drain(self, grace: float) -> None:
        """Stop taking jobs; jobs still running after ``grace`` seconds are requeued. Writes that fail are
        retried ``write_grace`` seconds more; then those runs end unwritten (their messages go back)."""
        logger.info("draining", extra={"grace_s": grace, "running_jobs": len(self.flights)})
        deadline = time.monotonic() + grace
        self.drain_deadline = min(deadline, self.drain_deadline or deadline)
        self.give_up_at = self.drain_deadline + self.write_grace
        self.wake.set()

    def stop(self) -> None:
        """Requeue whatever still runs and write what is unwritten (until the give-up time), then stop both
        threads and leave the workers table."""
        self.drain(0.0)
        flusher = self._threads[1]
        while self.flights and flusher.is_alive():
            time.sleep(0.05)
        self.stopping.set()
        self.wake.set()
        for thread in self._threads:
            thread.join(timeout=30)
        try:
            self.store.remove_worker(self.worker_id)
        except SQLAlchemyError as error:  # our heartbeats stop all the same: we age out of the table
            logger.warning("could not leave the workers table", extra={"error": describe(error)})
        self.health.set("stopped")

    # --- called from Celery's pool threads ---

    def run(self, job_id: str) -> RunResult:
        flight = self._claim(job_id)
        if isinstance(flight, RunResult):
            return flight
        self.commands.put(("add", flight))
        flight.done.wait()
        return RunResult.UNWRITTEN if flight.unwritten else RunResult.FINISHED

    def _claim(self, job_id: str) -> Flight | RunResult:
        """Claim a job for this message, retrying while the database is away: the thread keeps its seat
        meanwhile, so the worker takes no message it cannot start. With fair share the message is a ticket
        (worker/fair.py): it claims the fairest queued job, which another claim may take first; then the
        next. Every ticket a job's claim did not use stays in the broker for some other queued job."""
        failures, target, chosen = 0, None, False
        try:
            while self.drain_deadline is None:
                try:
                    if target is None:
                        reserved, failures = self._reserve(job_id), 0
                        if reserved is None:  # a duplicate message another thread is claiming
                            return RunResult.SKIPPED
                        target, chosen = reserved
                    job = self.store.claim(target, self.worker_id, retry=failures > 0)
                except SQLAlchemyError as error:
                    if not database_away(error):
                        raise
                    failures += 1
                    level = logging.WARNING if failures == 1 else logging.DEBUG  # the flusher logs the outage
                    logger.log(
                        level, "claim failed; retrying", extra={"job_id": job_id, "error": describe(error)}
                    )
                    time.sleep(self._backoff(failures))
                    continue
                if job is None and chosen:  # fair share's choice was taken first: this ticket takes the next
                    with self.lock:
                        self.claiming.discard(target)
                    target = None
                    continue
                if job is None:
                    logger.info("job not queued, skipping", extra={"job_id": job_id})
                    return RunResult.SKIPPED
                flight = Flight(job, JobResult.of(job.params))
                with self.lock:
                    self.flights[job.id] = flight
                return flight
            return RunResult.REFUSED
        finally:
            if target is not None:
                with self.lock:
                    self.claiming.discard(target)

    def _reserve(self, job_id: str) -> tuple[str, bool] | None:
        """The job this message's thread will claim, marked as being claimed, and whether fair share chose
        it; None if another thread is claiming the message's own job (a duplicate message)."""
        while True:
            with self.lock:
                skip = self.claiming | self.flights.keys()
            chosen = self.store.pick(job_id, skip)
            if chosen is not None and chosen != job_id:
                with self.lock:
                    if chosen not in self.claiming and chosen not in self.flights:
                        self.claiming.add(chosen)
                        return chosen, True
                continue  # another thread took it meanwhile: choose again
            with self.lock:
                held = self.flights.get(job_id)
            if held is not None:  # a duplicate message, or a requeue of a run still held: it ends first
                held.done.wait()
            with self.lock:
                if job_id not in self.claiming:
                    self.claiming.add(job_id)
                    return job_id, chosen is not None and self.store.fair
            if chosen is None or not self.store.fair:
                return None

    def _backoff(self, failures: int) -> float:
        """Seconds before the next try: doubling from the flush interval, at most one heartbeat period."""
        return min(self.flush_interval * 2**failures, self.heartbeat_interval)

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
            self.engine.abort(flight.request_id)
            return
        try:
            params = SamplingParams(**job.params)
            self.engine.add_request(flight.request_id, job.prompt_token_ids, params, job.priority)
        except (ValueError, TypeError) as error:
            self._end(flight, JobStatus.FAILED, error=f"rejected by the engine: {error}")

    def _record(self, output: RequestOutput) -> None:
        flight = self.flights.get(output.request_id.rpartition("#")[0])
        if flight is None or flight.request_id != output.request_id:  # a run we let go (its abort, say)
            return
        with self.lock:
            flight.result.fold(output, self._token_text)
            flight.dirty = True
        if self.streamer is not None and not flight.job.in_batch:
            text = "".join(sample.text for sample in output.outputs if sample.index == 0)
            self.streamer.put(flight.job.id, flight.job.attempt, text, output.finished)
        if output.finished and output.error is not None:  # its constraint did not compile in time
            self._end(flight, JobStatus.FAILED, error=f"rejected by the engine: {output.error}")
        elif output.finished:
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
            self.engine.abort(flight.request_id)
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
        """Write, poll cancels, heartbeat. A failed round is tried again, backing off; until one succeeds the
        worker does not heartbeat, so after the heartbeat timeout other workers take its jobs over (its
        later writes then find them lost, and it aborts them)."""
        last_tokens, last_time = 0.0, time.monotonic()
        failures, failing_since = 0, 0.0
        while not (self.stopping.is_set() and not self.flights):
            self.wake.wait(self.flush_interval)
            self.wake.clear()
            try:
                self._flush()
                self._poll_cancellations()
                now, tokens = time.monotonic(), self.stats.get("num_generated_tokens", 0.0)
                if now - last_time >= self.heartbeat_interval:
                    rate = (tokens - last_tokens) / (now - last_time)
                    self.store.heartbeat(self.worker_id, self._stats() | {"tokens_per_s": rate})
                    last_tokens, last_time = tokens, now
            except Exception as error:
                failures += 1
                failing_since = failing_since or time.monotonic()
                self._flush_failed(error, failures)
                time.sleep(self._backoff(failures))  # not cut short by a stop: it retries as long
            else:
                if failures:
                    outage = round(time.monotonic() - failing_since, 1)
                    logger.warning(
                        "flushing works again", extra={"failed_tries": failures, "outage_s": outage}
                    )
                    failures, failing_since = 0, 0.0
                self.health.succeeded(jobs=len(self.flights))
            self._enforce_drain_deadline()
            self._give_up_unwritten()

    def _flush_failed(self, error: Exception, failures: int) -> None:
        """One log line per failed round, naming what waits to be written."""
        self.health.failed(error)
        with self.lock:
            waiting = [f for f in self.flights.values() if f.dirty]
        results = [
            {"job_id": f.job.id, "attempt": f.job.attempt, "status": f.final.value}
            for f in waiting
            if f.final is not None
        ]
        logger.warning(
            "flush failed; retrying",
            exc_info=failures == 1,
            extra={
                "error": describe(error),
                "error_class": type(error).__name__,
                "failed_tries": failures,
                "retry_in_s": self._backoff(failures),
                "unwritten_jobs": len(waiting),
                "unwritten_results": results[:50],
            },
        )

    def _stats(self) -> dict[str, float]:
        return dict(self.stats) or {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}

    def _flush(self) -> None:
        with self.lock:
            due = [f for f in self.flights.values() if f.dirty]
            snapshot = [self._progress(f) for f in due]
            for f in due:
                f.dirty = False
        try:
            self._store(snapshot)
        except BaseException:
            with self.lock:  # what was not written is written whole at the next try
                for f in due:
                    f.dirty = True
            raise

    def _store(self, snapshot: list[Progress]) -> None:
        """Progress and results in one transaction, then each requeue; a run is released once its end is
        written, or once it turns out to be another run's."""
        requeues = [p for p in snapshot if p.status == JobStatus.QUEUED]
        writes = [p for p in snapshot if p.status != JobStatus.QUEUED]
        lost = self.store.write(writes) if writes else set()
        self._written(writes, lost)
        for p in writes:
            if p.status is not None and p.job_id in lost:
                logger.warning("result not written: the job is no longer ours", extra={"job_id": p.job_id})
            if p.status is not None or p.job_id in lost:
                self._release(p.job_id, lost=p.job_id in lost and p.status is None)
        for p in requeues:
            priority = self.store.requeue(p.job_id, p.attempt)
            if priority is not None:
                self._publish_requeued(p.job_id, priority)
            self._release(p.job_id, lost=False)

    def _publish_requeued(self, job_id: str, priority: int) -> None:
        try:
            self.publish(job_id, priority)
        except Exception as error:  # the row is queued: the reconciler republishes a job without a message
            logger.warning(
                "could not publish a requeued job", extra={"job_id": job_id, "error": describe(error)}
            )

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

    def _give_up_unwritten(self) -> None:
        """Past the give-up time, runs whose end is still unwritten are released as such: their messages go
        back to the broker, and their rows (still running, ours) are requeued once our heartbeat ages."""
        if self.give_up_at is None or time.monotonic() < self.give_up_at:
            return
        with self.lock:
            flights = list(self.flights.values())
            self.flights.clear()
        if flights:
            jobs = [{"job_id": f.job.id, "attempt": f.job.attempt} for f in flights]
            logger.error("shutting down with runs unwritten; their messages go back", extra={"jobs": jobs})
        for flight in flights:
            flight.unwritten = True
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
