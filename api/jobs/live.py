"""Following a job's live stream (``core/streams.py``): what its Redis stream holds, then what is published.

One pub/sub connection per API process carries the entries of every job it streams. Each reader
registers a queue for its job; the first one subscribes to the job's channel and the last one to leave
unsubscribes; a listener task hands every message to the queues of its job. What a reader may miss
(entries from before it subscribed, a message lost while the connection was re-established) it reads
from the stream. A reader announces itself while it reads (``core/streams.announce_reader``): workers stream
only the runs someone follows.
"""

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from core.streams import WATCH_RENEW_S, StreamEntry, announce_reader, channel_key, stream_key

logger = logging.getLogger(__name__)

PREFIX = channel_key("")
# How often a quiet reader hears None (a job may end without a token: cancelled while queued), after
# reading the stream; the events then read the job's row. At 256 running jobs a step takes about a
# second, and checking every second cost the API 2 ms of CPU per streamed token (bench/service_cpu.py).
IDLE_CHECK_S = 3.0
# Connections per API process. Past them a reader waits its turn: redis-py's default pool fails the
# command instead (past 100), which broke streams when a batch's 256 followers idle-checked at once.
REDIS_CONNECTIONS = 32


class LiveStreams:
    def __init__(self, url: str) -> None:
        pool = BlockingConnectionPool.from_url(url, max_connections=REDIS_CONNECTIONS)
        self._redis = Redis(connection_pool=pool)
        self._pubsub: PubSub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._readers: defaultdict[str, set[asyncio.Queue[StreamEntry]]] = defaultdict(set)

    async def entries(self, job_id: str) -> AsyncIterator[StreamEntry | None]:
        """The job's entries in order, each once: first what its stream holds, then as they are published.
        None after ``IDLE_CHECK_S`` without one."""
        seen = (0, 0)
        # Subscribed before the stream is read: nothing falls between the two.
        async with self._follow(job_id) as published:
            await self._announce(job_id)  # once subscribed: the worker's first entry then reaches us
            renew_at = time.monotonic() + WATCH_RENEW_S
            missed = await self._stream_after(job_id, seen)
            while True:
                if time.monotonic() >= renew_at:
                    await self._announce(job_id)
                    renew_at = time.monotonic() + WATCH_RENEW_S
                for entry in missed:
                    if entry.position > seen:
                        seen = entry.position
                        yield entry
                try:
                    async with asyncio.timeout(IDLE_CHECK_S):
                        entry = await published.get()
                except TimeoutError:
                    missed = await self._stream_after(job_id, seen)
                    if not missed:
                        yield None
                    continue
                if entry.position <= seen:  # already read from the stream
                    missed = []
                elif entry.follows(seen):
                    missed = [entry]
                else:  # a gap (a message lost while the connection was re-established)
                    missed = await self._stream_after(job_id, seen)

    async def _announce(self, job_id: str) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                announce_reader(pipe, job_id)
                await pipe.execute()
        except RedisError as error:  # unstreamed, the job still ends: its row has the output
            logger.warning("could not announce a reader", extra={"job_id": job_id, "error": str(error)})

    async def _stream_after(self, job_id: str, position: tuple[int, int]) -> list[StreamEntry]:
        entries = await self._redis.xrange(stream_key(job_id), min="({}-{}".format(*position))
        return [StreamEntry.from_stream(entry_id, fields) for entry_id, fields in entries]

    @asynccontextmanager
    async def _follow(self, job_id: str) -> AsyncIterator[asyncio.Queue[StreamEntry]]:
        """A queue of the job's entries published from now on, until the block ends."""
        pubsub = await self._connected_pubsub()
        queue: asyncio.Queue[StreamEntry] = asyncio.Queue()
        readers = self._readers[job_id]
        readers.add(queue)
        try:
            if len(readers) == 1:
                await pubsub.subscribe(channel_key(job_id))
            self._ensure_listener(pubsub)
            yield queue
        finally:
            readers.discard(queue)
            if not readers:
                del self._readers[job_id]
                await self._unsubscribe(pubsub, job_id)

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        if self._pubsub is not None:
            await self._pubsub.aclose()
        await self._redis.aclose()

    async def _connected_pubsub(self) -> PubSub:
        """This loop's pub/sub, its connection taken once: readers subscribing at once would each take
        one from the pool for it (redis-py's ``PubSub`` connects on a command when it has none), keeping
        all but the last."""
        # A connection belongs to the event loop that opened it (tests run several loops, one after another).
        loop = asyncio.get_running_loop()
        if self._pubsub is None or self._loop is not loop:
            self._pubsub, self._loop, self._listener = self._redis.pubsub(), loop, None
            self._connecting = asyncio.Lock()
            self._readers.clear()
        pubsub = self._pubsub
        async with self._connecting:
            if pubsub.connection is None:
                await pubsub.connect()
        return pubsub

    def _ensure_listener(self, pubsub: PubSub) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen(pubsub))

    async def _listen(self, pubsub: PubSub) -> None:
        try:
            while self._readers:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                if message is None or message["type"] != "message":
                    continue
                job_id = message["channel"].decode().removeprefix(PREFIX)
                entry = StreamEntry.from_message(message["data"])
                for queue in self._readers.get(job_id, ()):
                    queue.put_nowait(entry)
        except RedisError as error:  # readers fall back on reading the stream; the next reader restarts this
            logger.warning("live stream listener stopped", extra={"error": str(error)})

    async def _unsubscribe(self, pubsub: PubSub, job_id: str) -> None:
        try:
            await pubsub.unsubscribe(channel_key(job_id))
            if job_id in self._readers:  # a new reader came while this was sent
                await pubsub.subscribe(channel_key(job_id))
        except RedisError as error:
            logger.warning("could not unsubscribe", extra={"job_id": job_id, "error": str(error)})
