"""The engine thread: the one thread that builds and steps the engine, fed by typed commands.

It never touches the database, so a slow write never stalls a decode step: it folds each step's outputs
into the registry (worker/flights.py), which the flusher writes, and writes the new text of runs someone
reads to their Redis streams (worker/streamer.py), once per step.
"""

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from core.states import JobStatus
from core.timings import ms
from worker.engine import EngineStats, RequestOutput, SamplingParams
from worker.flights import Flight, Flights
from worker.os_threads import name_this_thread
from worker.streamer import TokenStreamer

logger = logging.getLogger("pagedq.worker")

RECENT_PREFIXES = 256  # the prefix keys of the last runs added, checked against the cache after each step
# A yield for readers' first tokens (``TokenStreamer.first_token_yield``) at most once per this many steps:
# a pause is every running run's, and streamed requests that start one after another must not keep a
# full batch waiting at each start (on two cores a step is >= 10 ms: under 1% of its time at 1.5 ms).
YIELD_EVERY_STEPS = 16


@dataclass(frozen=True)
class AddRun:
    flight: Flight


@dataclass(frozen=True)
class AbortRun:
    flight: Flight


Command = AddRun | AbortRun


class Decoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


class Engine(Protocol):
    """What the loop uses of an engine: worker/engine's ``LLMEngine``, or a test's double."""

    @property
    def tokenizer(self) -> Decoder: ...
    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        priority: int,
        continue_from: list[int] | None = None,
    ) -> None:
        """Raises ValueError when the request can never be served; ``continue_from``: an earlier run's
        output tokens, which it goes on from."""

    def abort(self, request_id: str) -> bool: ...
    def has_unfinished_requests(self) -> bool: ...
    def step(self) -> list[RequestOutput]: ...
    def stats(self) -> EngineStats: ...
    def cached_prefixes(self, keys: Iterable[int]) -> list[int]: ...


E = TypeVar("E", bound=Engine)


class EngineLoop(Generic[E]):
    def __init__(
        self, build_engine: Callable[[], E], flights: Flights, streamer: TokenStreamer | None = None
    ) -> None:
        self.build_engine, self.flights, self.streamer = build_engine, flights, streamer
        self.engine: E  # built, and only ever used, on the engine thread
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._commands: queue.Queue[Command] = queue.Queue()
        self._stopping = threading.Event()
        self._stats: dict[str, float] = {}
        self._peak_running = 0
        self._token_texts: dict[int, str] = {}
        self._recent_prefixes: OrderedDict[int, None] = OrderedDict()  # of the runs added, newest last
        self._held_prefixes: frozenset[int] = frozenset()
        self._step_cpu = 0.0  # this thread's CPU seconds inside step(), and its engine's build
        self._opened_stream = False  # the step's outputs opened a reader's stream
        self._steps_since_yield = YIELD_EVERY_STEPS
        self.pause: Callable[[float], None] = time.sleep  # the yield to readers (a test records it)
        self._thread = threading.Thread(target=self._run, name="pagedq-engine", daemon=True)

    def start(self) -> None:
        """Build the engine on the engine thread, where it will run; returns once it is built.

        On CPU this matters: OpenMP keeps a thread team per thread that runs parallel ops, and once the
        process has more of those threads than cores its helpers sleep between ops instead of spinning
        (a decode step then took ~40% longer). So only the engine thread ever runs the model.
        """
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"the engine could not be built: {self._error}") from self._error

    def stop(self) -> None:
        """Stops after the step in flight, waiting a second at most: the runs are all let go by now, and a
        long prefill's step must not hold a stopping worker."""
        self._stopping.set()
        self._thread.join(timeout=1.0)

    def add(self, flight: Flight) -> None:
        self._commands.put(AddRun(flight))

    def abort(self, flight: Flight) -> None:
        self._commands.put(AbortRun(flight))

    def stats(self) -> dict[str, float]:
        """The engine's stats after its last step, for the worker's heartbeat."""
        return dict(self._stats) or {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}

    def held_prefixes(self) -> frozenset[int]:
        """The prefix keys (jobs.prefix_key) of recent runs whose blocks the engine's cache holds, as of
        its last step: what the claim prefers (worker/fair.py) and the heartbeat publishes."""
        return self._held_prefixes

    def _run(self) -> None:
        name_this_thread("pagedq-engine", bookkeeping=False)
        try:
            self.engine = self.build_engine()
        except BaseException as error:  # start() re-raises it in the main thread
            self._error = error
            return
        finally:
            self._step_cpu = time.thread_time()
            self._ready.set()
        while not self._stopping.is_set():
            self._take_commands(block=not self.engine.has_unfinished_requests())
            if self.streamer is not None:
                self.streamer.flush()  # a resumed run's text so far
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self._step()
            except Exception as error:  # a broken step fails its jobs rather than hanging them
                logger.exception("engine step failed")
                self._fail_all(f"engine step failed: {error!r}")
                continue
            for output in outputs:
                self._record(output)
            if self.streamer is not None:
                self.streamer.flush()
            self._update_stats()
            self._yield_to_readers()

    def _step(self) -> list[RequestOutput]:
        started = time.thread_time()
        try:
            return self.engine.step()
        finally:
            self._step_cpu += time.thread_time() - started

    def _yield_to_readers(self) -> None:
        """After a step that opened a reader's stream, wait ``first_token_yield`` before the next: the
        first token's way to its reader (the streamer, Redis, the API, the client) then runs on the cores
        the next step would take, not between its threads (bench/RESULTS.md, 2026-11-29)."""
        self._steps_since_yield += 1
        opened, self._opened_stream = self._opened_stream, False
        if not opened or self.streamer is None or not self.streamer.first_token_yield:
            return
        if self._steps_since_yield >= YIELD_EVERY_STEPS:
            self._steps_since_yield = 0
            self.pause(self.streamer.first_token_yield)

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.1) if block else self._commands.get_nowait()
            while True:
                self._apply(command)
                command = self._commands.get_nowait()
        except queue.Empty:
            return

    def _apply(self, command: Command) -> None:
        match command:
            case AbortRun(flight):
                self.engine.abort(flight.request_id)
            case AddRun(flight) if flight.final is not None:
                pass  # claimed while a step failed, and failed with it: it ends once, out of the engine
            case AddRun(flight):
                job = flight.job
                if job.prefix_key is not None:
                    self._recent_prefixes[job.prefix_key] = None
                    self._recent_prefixes.move_to_end(job.prefix_key)
                    if len(self._recent_prefixes) > RECENT_PREFIXES:
                        self._recent_prefixes.popitem(last=False)
                try:
                    self._add_request(flight)
                except (ValueError, TypeError) as error:
                    self.flights.end(flight, JobStatus.FAILED, error=f"rejected by the engine: {error}")

    # What differs by the kind of engine (worker/embedding_host.py's loop overrides these three).

    def _add_request(self, flight: Flight) -> None:
        """Hand a claimed run to the engine; raises ValueError or TypeError for one it refuses."""
        job = flight.job
        params = SamplingParams(**job.params)
        resumed = job.resume.token_ids if job.resume else None
        self.engine.add_request(
            flight.request_id, job.prompt_token_ids, params, job.priority, continue_from=resumed
        )
        if job.resume and self.streamer is not None and not job.in_batch:  # its reader skips what it has
            self.streamer.feed(job.id, job.attempt, "", job.resume.text, finished=False, resumed=True)

    def _record(self, output: RequestOutput) -> None:
        flight = self.flights.held(output.request_id.rpartition("#")[0])
        if flight is None or flight.request_id != output.request_id:  # a run we let go (its abort, say)
            return
        self.flights.fold(flight, output, self._token_text)
        if self.streamer is not None and not flight.job.in_batch:
            text = "".join(sample.text for sample in output.outputs if sample.index == 0)
            whole = flight.result.choices[0].text  # this thread alone changes it
            resumed = flight.job.resume is not None
            if self.streamer.feed(flight.job.id, flight.job.attempt, text, whole, output.finished, resumed):
                self._opened_stream = True
        if output.finished and output.error is not None:  # its constraint failed
            self.flights.end(flight, JobStatus.FAILED, error=f"rejected by the engine: {output.error}")
        elif output.finished:
            reason = flight.result.choices[0].finish_reason
            status = flight.abort_as if reason == "abort" and flight.abort_as else JobStatus.SUCCEEDED
            self.flights.end(flight, status, finish_reason=reason)

    def _token_text(self, token_id: int) -> str:
        """A token's text for its logprobs, cached: the engine's tokenizer, used only on this thread."""
        if (text := self._token_texts.get(token_id)) is None:
            text = self._token_texts[token_id] = self.engine.tokenizer.decode([token_id])
        return text

    def _fail_all(self, error: str) -> None:
        for flight in self.flights.unfinished():
            self.engine.abort(flight.request_id)
            self.flights.end(flight, JobStatus.FAILED, error=error)
        self.engine.step()  # collects the aborts so the engine is empty again

    def _update_stats(self) -> None:
        self._held_prefixes = frozenset(self.engine.cached_prefixes(self._recent_prefixes))
        stats = self.engine.stats()
        self._peak_running = max(self._peak_running, stats.num_running)
        self._stats = {
            "num_running": stats.num_running,
            "num_waiting": stats.num_waiting,
            "kv_cache_usage": stats.kv_cache_usage,
            "num_preemptions": stats.num_preemptions,
            "num_generated_tokens": stats.num_generated_tokens,
            "peak_running": self._peak_running,
            "busy_ms": ms(stats.busy_time * 1000),  # what its jobs' usage.engine_ms add up to
            # the engine thread's CPU outside step(): folding outputs, feeding the streamer, commands
            "loop_cpu_ms": ms((time.thread_time() - self._step_cpu) * 1000),
        }
