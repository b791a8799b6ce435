"""The broker on Redis: kombu's Redis transport, with one client object per connection pool.

kombu makes a new ``redis.Redis`` for each command it sends outside a consumer's own connection (a
publish, and a message's unacknowledged bookkeeping as it is received and as it is acknowledged), and
redis-py builds every one with a case-insensitive copy of its ~170 reply callbacks: about a fifth of
the CPU a job's message costs the worker's Celery threads (bench/RESULTS.md, 2026-11-28). A client is
thread-safe (each command takes a connection from the pool), so a channel keeps one for its pool.
"""

from typing import Any

from kombu.transport import redis as kombu_redis

SCHEME = "redis"  # the URLs this transport takes; the others (rediss, sentinel, sockets) keep kombu's
TRANSPORT = f"{__name__}:Transport"


class Channel(kombu_redis.Channel):
    _kept_client: tuple[Any, Any] | None = None  # (the pool, the client made for it)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the consumer's own client: kombu makes it once
            return super()._create_client(asynchronous=True)
        pool, kept = self.pool, self._kept_client
        if kept is None or kept[0] is not pool:  # the first, or a new pool (after a fork)
            kept = self._kept_client = (pool, super()._create_client())
        return kept[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
