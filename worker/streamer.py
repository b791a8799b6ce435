"""Appends a job's new text to its Redis stream and publishes it (``core/streams.py``), from a thread
of its own so the engine never waits; only for runs a reader follows (``worker/watchers.py``).

The writes go out on a connection of the streamer's own with Redis's replies turned off
(``CLIENT REPLY OFF``): nothing reads them (a stale run's refused entry was only ever dropped), and
waiting for them woke this thread a second time per token, to take the GIL from the engine's step. On
two cores that took a third to a half off its CPU per streamed token (bench/RESULTS.md, 2026-11-27).

A reader's first token has four processes to cross (this thread, Redis, the API, the client), and on a
CPU the engine's next step takes every core as soon as it starts: ``first_token_yield`` is how long the
engine thread waits after a step that opened a stream, so that they run first (worker/engine_loop.py)."""

import logging
import queue
import threading
from dataclasses import dataclass

import redis

from core.models import storable
from core.streams import STREAM_TTL_S, StreamEntry, channel_key, stream_key
from worker.os_threads import name_this_thread
from worker.watchers import Watchers

logger = logging.getLogger("pagedq.worker")


@dataclass(frozen=True)
class Piece:
    job_id: str
    attempt: int
    text: str
    finished: bool
    resumed: bool = False  # the first piece of a run that goes on from an earlier one: the text so far


class TokenStreamer:
    def __init__(self, url: str, first_token_yield: float = 0.0) -> None:
        self.first_token_yield = first_token_yield  # seconds; 0: the engine goes on at once
        self._redis = redis.Redis.from_url(url)
        self._connection: redis.Connection | None = None  # the writes', replies off (``_connected``)
        self._pieces: queue.SimpleQueue[Piece | None] = queue.SimpleQueue()
        self._seqs: dict[tuple[str, int], int] = {}  # (job, attempt): its last entry; its stream has a TTL
        self.watchers = Watchers(self._redis)
        self._fed: set[tuple[str, int]] = set()  # the runs ``feed`` streams (the engine thread's)
        self._thread = threading.Thread(target=self._run, name="pagedq-streamer", daemon=True)
        self._thread.start()

    def feed(
        self, job_id: str, attempt: int, new: str, whole: str, finished: bool, resumed: bool = False
    ) -> bool:
        """A step's ``new`` text of a run (``whole``: all its text so far), streamed only once a reader
        follows the job: then the run's first entry is all its text so far, and it streams to its end.
        ``resumed``: the run goes on from an earlier run's flushed text (its first entry says so).
        Returns whether this opened the run's stream (a reader waits for its first entry)."""
        run = (job_id, attempt)
        first = run not in self._fed
        if first:
            if not self.watchers.watched(job_id):
                return False
            self._fed.add(run)
            new = whole
        if finished:
            self._fed.discard(run)
        self.put(job_id, attempt, new, finished, resumed=first and resumed)
        return first

    def put(self, job_id: str, attempt: int, text: str, finished: bool, resumed: bool = False) -> None:
        if text or finished or resumed:
            self._pieces.put(Piece(job_id, attempt, text, finished, resumed))

    def close(self) -> None:
        self._pieces.put(None)
        self._thread.join(timeout=10)
        self._disconnect()
        self.watchers.close()

    def _run(self) -> None:
        name_this_thread("pagedq-streamer")
        while True:
            batch = [self._pieces.get()]
            while not self._pieces.empty():
                batch.append(self._pieces.get())
            if pieces := [p for p in batch if p is not None]:
                self._write(pieces)
            if None in batch:
                return

    def _write(self, batch: list[Piece]) -> None:
        commands: list[tuple[str | int, ...]] = []
        for piece in batch:
            run = (piece.job_id, piece.attempt)
            key, seq = stream_key(piece.job_id), self._seqs.get(run, 0) + 1
            entry = StreamEntry(piece.attempt, seq, storable(piece.text), piece.finished, piece.resumed)
            # An explicit id: a stale run's entries, older than the stream's newest, are refused.
            fields = (item for pair in entry.fields().items() for item in pair)
            commands.append(("XADD", key, entry.entry_id, *fields))
            commands.append(("PUBLISH", channel_key(piece.job_id), entry.message()))
            if seq == 1 or piece.finished:
                commands.append(("EXPIRE", key, STREAM_TTL_S))  # at the start too: a dead run leaves no key
            if piece.finished:
                self._seqs.pop(run, None)
            else:
                self._seqs[run] = seq
        for tries_left in (1, 0):  # once more on a new connection: Redis may have restarted
            try:
                connection = self._connected()
                connection.send_packed_command(connection.pack_commands(commands), check_health=False)
                return
            except redis.RedisError as error:  # best effort: the database has the output either way
                self._disconnect()
                if not tries_left:
                    extra = {"error": str(error), "pieces": len(batch)}
                    logger.warning("could not stream tokens", extra=extra)

    def _connected(self) -> redis.Connection:
        """The writes' connection; a new one if the server closed it (it sends nothing else), which a
        write would not find out at once: the kernel takes the bytes."""
        if self._connection is not None and _closed(self._connection):
            self._disconnect()
        if self._connection is None:
            connection = self._redis.connection_pool.make_connection()
            connection.connect()
            connection.send_command("CLIENT", "REPLY", "OFF", check_health=False)
            self._connection = connection
        return self._connection

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.disconnect()
            self._connection = None


def _closed(connection: redis.Connection) -> bool:
    try:
        return connection.can_read()
    except redis.ConnectionError:
        return True
