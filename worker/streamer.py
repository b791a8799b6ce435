"""Appends a job's new text to its Redis stream and publishes it (``core/streams.py``); only for runs a
reader follows (``worker/watchers.py``).

The engine thread writes a step's pieces itself, once per step (``flush``), on a connection of the
streamer's own with Redis's replies turned off (``CLIENT REPLY OFF``): nothing reads them (a stale run's
refused entry was only ever dropped). Handing them to a thread instead woke it at every step, and on two
cores that thread ran between the engine's OpenMP threads during the next step, stalling it
(bench/RESULTS.md, 2026-11-29, twenty-fourth session). The engine never waits on Redis: its write sends
what the socket takes at once, and whatever does not go out (no connection yet, a Redis restarted, or
stalled with the socket's buffer full) goes to the streamer's thread, which finishes it on the same
connection, or connects and writes it again, in order, before the engine thread writes again.

A reader's first token has four processes to cross (the engine's write, Redis, the API, the client),
and on a CPU the engine's next step takes every core as soon as it starts: ``first_token_yield`` is how
long the engine thread waits after a step that opened a stream, so that they run first
(worker/engine_loop.py)."""

import logging
import queue
import socket
import ssl
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


CONNECT_TIMEOUT_S = 5.0  # the streamer's thread's: a Redis unreachable costs the readers' tokens only

Commands = list[tuple[str | int, ...]]


@dataclass(frozen=True)
class Unsent:
    """A flush's commands that the engine thread could not write, or finish: ``rest`` is the end of a
    write begun on the current connection (the thread sends it there: a new connection might run it
    before what the old one still holds, and Redis would then refuse those earlier entries)."""

    commands: Commands
    rest: bytes | None = None


class TokenStreamer:
    def __init__(self, url: str, first_token_yield: float = 0.0) -> None:
        self.first_token_yield = first_token_yield  # seconds; 0: the engine goes on at once
        self._redis = redis.Redis.from_url(url)
        self._writes_pool = redis.ConnectionPool.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S)
        self._seqs: dict[tuple[str, int], int] = {}  # (job, attempt): its last entry; its stream has a TTL
        self._pending: list[Piece] = []  # put since the last flush
        self._fed: set[tuple[str, int]] = set()  # the runs ``feed`` streams
        # What the engine thread could not write, for the streamer's thread to write in order; while that
        # thread has some (``_behind``), later flushes queue theirs after them.
        self._behind_queue: queue.SimpleQueue[Unsent | None] = queue.SimpleQueue()
        self._behind = True  # and until the thread has connected
        self._lock = threading.Lock()  # over ``_behind``; the connection is the thread's while behind
        self._connection: redis.Connection | None = None  # the writes', replies off (``_connect``)
        self.watchers = Watchers(self._redis)
        self._thread = threading.Thread(target=self._run, name="pagedq-streamer", daemon=True)
        self._thread.start()
        self._behind_queue.put(Unsent([]))  # connects at once: the first flush finds the connection open

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
        """A piece for the next ``flush``; ``feed``, ``put`` and ``flush`` are one thread's (the engine's)."""
        if text or finished or resumed:
            self._pending.append(Piece(job_id, attempt, text, finished, resumed))

    def flush(self) -> None:
        """Writes the pieces put since the last flush, at once when nothing waits ahead of them on the
        streamer's thread, else after what does (by that thread)."""
        if not self._pending:
            return
        commands, self._pending = self._commands(self._pending), []
        with self._lock:
            unsent = Unsent(commands) if self._behind else self._send_at_once(commands)
            if unsent is not None:
                self._behind = True
                self._behind_queue.put(unsent)

    def close(self) -> None:
        self._behind_queue.put(None)
        self._thread.join(timeout=10)
        self._disconnect()
        self.watchers.close()

    def _commands(self, pieces: list[Piece]) -> Commands:
        commands: Commands = []
        for piece in pieces:
            run = (piece.job_id, piece.attempt)
            key, seq = stream_key(piece.job_id), self._seqs.get(run, 0) + 1
            entry = StreamEntry(piece.attempt, seq, storable(piece.text), piece.finished, piece.resumed)
            # An explicit id: a stale run's entries, older than the stream's newest, are refused (and so
            # is an entry written again after a write that failed half-way).
            fields = (item for pair in entry.fields().items() for item in pair)
            commands.append(("XADD", key, entry.entry_id, *fields))
            commands.append(("PUBLISH", channel_key(piece.job_id), entry.message()))
            if seq == 1 or piece.finished:
                commands.append(("EXPIRE", key, STREAM_TTL_S))  # at the start too: a dead run leaves no key
            if piece.finished:
                self._seqs.pop(run, None)
            else:
                self._seqs[run] = seq
        return commands

    def _send_at_once(self, commands: Commands) -> Unsent | None:
        """Sends what the socket takes without waiting; None when it took it all, else what is left."""
        connection = self._connection
        if connection is None or _closed(connection):
            self._disconnect()
            return Unsent(commands)
        data = _packed(connection, commands)
        try:
            sent = _socket(connection).send(data)
        except (BlockingIOError, ssl.SSLWantWriteError):  # no room at all (TLS: the thread sends it again)
            sent = 0
        except OSError:  # the server is gone, and with it what it had not read
            self._disconnect()
            return Unsent(commands)
        return None if sent == len(data) else Unsent(commands, data[sent:])

    def _run(self) -> None:
        name_this_thread("pagedq-streamer")
        while (unsent := self._behind_queue.get()) is not None:
            self._write_behind(unsent)

    def _write_behind(self, unsent: Unsent) -> None:
        """Writes what the engine thread could not, waiting as long as Redis takes; then lets it write
        again, without waiting."""
        if unsent.rest is None or self._connection is None or not self._sent(unsent.rest):
            self._write_again(unsent.commands)
        with self._lock:
            if self._connection is not None and self._behind_queue.empty():
                _socket(self._connection).setblocking(False)
                self._behind = False

    def _write_again(self, commands: Commands) -> None:
        """``commands`` on the open connection, else a new one: a write that failed half-way is sent
        whole again (the entries it wrote are refused the second time: their ids are explicit)."""
        for _ in range(2):  # once more on a new connection: Redis may have restarted
            if self._connection is None:
                self._connection = self._connect()
            if self._connection is None:
                continue
            if not commands or self._sent(_packed(self._connection, commands)):
                return
        if commands:  # best effort: the database has the output either way
            logger.warning("could not stream tokens", extra={"commands": len(commands)})

    def _sent(self, data: bytes) -> bool:
        """Whether ``data`` went out on the open connection, waiting for room; a failed one is let go."""
        assert self._connection is not None
        sock = _socket(self._connection)
        try:
            sock.setblocking(True)
            sock.sendall(data)
            return True
        except OSError:
            self._disconnect()
            return False

    def _connect(self) -> redis.Connection | None:
        """A new connection for the writes, replies off; None when Redis cannot be reached."""
        connection = self._writes_pool.make_connection()
        try:
            connection.connect()
            connection.send_command("CLIENT", "REPLY", "OFF", check_health=False)
            return connection
        except redis.RedisError as error:
            connection.disconnect()
            logger.debug("could not connect to stream tokens", extra={"error": str(error)})
            return None

    def _disconnect(self) -> None:
        if self._connection is not None:
            self._connection.disconnect()
            self._connection = None


def _socket(connection: redis.Connection) -> socket.socket:
    """The connection's socket (redis-py keeps it in ``_sock``): its writes here send what the socket
    takes at once and leave the rest to the thread, which ``send_packed_command`` cannot (it waits)."""
    sock = connection._sock
    assert sock is not None, "the connection is open"
    return sock


def _packed(connection: redis.Connection, commands: Commands) -> bytes:
    return b"".join(connection.pack_commands(commands))


def _closed(connection: redis.Connection) -> bool:
    """Whether the server closed the writes' connection (it sends nothing else), which a write would not
    find out at once: the kernel takes the bytes."""
    try:
        return connection.can_read()
    except redis.ConnectionError:
        return True
