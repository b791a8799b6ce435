"""Which jobs a reader follows now, as the API announces them (``core/streams.announce_reader``).

A thread of its own listens on the announcement channel (a reader's first token is not kept waiting)
and reads the set of watched jobs every few seconds (what was announced while it was not listening,
and renewals); the engine thread asks ``watched`` for each run's output, a lookup in a dict.
"""

import logging
import threading
import time

import redis

from core.streams import WATCH_RENEW_S, WATCH_TTL_S, WATCHED_KEY, WATCHING_CHANNEL
from worker.os_threads import name_this_thread

logger = logging.getLogger("pagedq.worker")


class Watchers:
    def __init__(self, client: redis.Redis, read_every: float = WATCH_RENEW_S / 2) -> None:
        self._redis, self._read_every = client, read_every
        self._until: dict[str, float] = {}  # job id -> until when (unix seconds) someone reads it
        self._stopping = threading.Event()
        self._failures = 0  # tries to reach Redis failed in a row
        self._thread = threading.Thread(target=self._run, name="pagedq-watchers", daemon=True)
        self._thread.start()

    def watched(self, job_id: str) -> bool:
        return self._until.get(job_id, 0.0) > time.time()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        name_this_thread("pagedq-watchers")
        while not self._stopping.is_set():
            try:
                self._listen()
            except redis.RedisError as error:  # runs go unstreamed meanwhile; readers fall back on the row
                self._failures += 1
                level = logging.WARNING if self._failures == 1 else logging.DEBUG  # once per outage
                logger.log(level, "could not follow the job readers", extra={"error": str(error)})
                self._stopping.wait(min(self._failures, 5))

    def _listen(self) -> None:
        with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
            pubsub.subscribe(WATCHING_CHANNEL)
            read_at = 0.0  # the set is read once subscribed: nothing announced before is missed
            while not self._stopping.is_set():
                if time.monotonic() >= read_at:
                    self._read()
                    read_at = time.monotonic() + self._read_every
                message = pubsub.get_message(timeout=min(self._read_every, 0.5))
                if message is not None and message["type"] == "message":
                    self._until = self._until | {message["data"].decode(): time.time() + WATCH_TTL_S}

    def _read(self) -> None:
        now = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.zrangebyscore(WATCHED_KEY, now, "+inf", withscores=True)
        pipe.zremrangebyscore(WATCHED_KEY, "-inf", now - WATCH_TTL_S)  # long gone readers
        watched, _ = pipe.execute()
        self._until = {job_id.decode(): until for job_id, until in watched}
        self._failures = 0
