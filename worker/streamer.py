"""Appends each job's new text to its Redis stream, from a thread of its own so the engine never waits."""

import logging
import queue
import threading
from dataclasses import dataclass

import redis

from core.models import storable
from core.streams import STREAM_TTL_S, stream_key

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
        self._expiring: set[str] = set()  # jobs whose stream already has a TTL
        self._thread = threading.Thread(target=self._run, name="pagedq-streamer", daemon=True)
        self._thread.start()

    def put(self, job_id: str, attempt: int, text: str, finished: bool) -> None:
        if text or finished:
            self._pieces.put(Piece(job_id, attempt, text, finished))

    def close(self) -> None:
        self._pieces.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
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
            key = stream_key(piece.job_id)
            if piece.text:
                pipe.xadd(key, {"attempt": piece.attempt, "text": storable(piece.text)})
            if piece.finished:
                pipe.xadd(key, {"attempt": piece.attempt, "end": 1})
            if piece.finished or piece.job_id not in self._expiring:
                pipe.expire(key, STREAM_TTL_S)  # at the start too: a run that dies leaves no key behind
            if piece.finished:
                self._expiring.discard(piece.job_id)
            else:
                self._expiring.add(piece.job_id)
        try:
            pipe.execute()
        except redis.RedisError as error:  # best effort: the database has the output either way
            logger.warning("could not stream tokens", extra={"error": str(error), "pieces": len(batch)})
