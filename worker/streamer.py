"""Appends a job's new text to its Redis stream and publishes it (``core/streams.py``), from a thread
of its own so the engine never waits; only for runs a reader follows (``worker/watchers.py``)."""

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


class TokenStreamer:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)
        self._pieces: queue.SimpleQueue[Piece | None] = queue.SimpleQueue()
        self._seqs: dict[tuple[str, int], int] = {}  # (job, attempt): its last entry; its stream has a TTL
        self.watchers = Watchers(self._redis)
        self._fed: set[tuple[str, int]] = set()  # the runs ``feed`` streams (the engine thread's)
        self._thread = threading.Thread(target=self._run, name="pagedq-streamer", daemon=True)
        self._thread.start()

    def feed(self, job_id: str, attempt: int, new: str, whole: str, finished: bool) -> None:
        """A step's ``new`` text of a run (``whole``: all its text so far), streamed only once a reader
        follows the job: then the run's first entry is all its text so far, and it streams to its end."""
        run = (job_id, attempt)
        if run not in self._fed:
            if not self.watchers.watched(job_id):
                return
            self._fed.add(run)
            new = whole
        if finished:
            self._fed.discard(run)
        self.put(job_id, attempt, new, finished)

    def put(self, job_id: str, attempt: int, text: str, finished: bool) -> None:
        if text or finished:
            self._pieces.put(Piece(job_id, attempt, text, finished))

    def close(self) -> None:
        self._pieces.put(None)
        self._thread.join(timeout=10)
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
        pipe = self._redis.pipeline(transaction=False)
        for piece in batch:
            run = (piece.job_id, piece.attempt)
            key, seq = stream_key(piece.job_id), self._seqs.get(run, 0) + 1
            entry = StreamEntry(piece.attempt, seq, storable(piece.text), piece.finished)
            # An explicit id: a stale run's entries, older than the stream's newest, are refused.
            pipe.xadd(key, entry.fields(), id=entry.entry_id)
            pipe.publish(channel_key(piece.job_id), entry.message())
            if seq == 1 or piece.finished:
                pipe.expire(key, STREAM_TTL_S)  # at the start too: a run that dies leaves no key behind
            if piece.finished:
                self._seqs.pop(run, None)
            else:
                self._seqs[run] = seq
        try:
            pipe.execute()
        except redis.RedisError as error:  # best effort: the database has the output either way
            logger.warning("could not stream tokens", extra={"error": str(error), "pieces": len(batch)})
