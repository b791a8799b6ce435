"""A job's live stream in Redis: the worker's ``TokenStreamer`` writes it, the API's ``LiveStreams`` reads it.

Against the real Redis: entries come in order and each once, whether read from the stream or as they
are published; a lost message is read from the stream; a requeued run starts over, and a stale run's
entries are refused. Only a run someone reads is streamed, from all its text so far. The writer goes on
after Redis restarts, and never waits on a stalled one, whose entries all come once it reads again (a
server of the test's own).
"""

import asyncio
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from api.jobs import live
from api.jobs.live import LiveStreams
from api.jobs.streams import Continuation
from core.streams import WATCH_TTL_S, WATCHED_KEY, StreamEntry, announce_reader, channel_key, stream_key
from tests.support.private_redis import private_redis
from tests.support.services import async_wait_for, redis_url, wait_for
from worker.streamer import TokenStreamer

STALL_S = 4.0  # how long the stalled Redis reads nothing


@pytest.fixture
def url() -> str:
    return redis_url()


@pytest.fixture
def job_id(url: str) -> Iterator[str]:
    job = f"job_test_{uuid.uuid4().hex[:12]}"
    yield job
    redis.Redis.from_url(url).delete(stream_key(job))


@pytest.fixture
def streamer(url: str) -> Iterator[TokenStreamer]:
    """The worker's writer."""
    writer = TokenStreamer(url)
    yield writer
    writer.close()


@pytest.fixture(autouse=True)
def _quick_idle_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "IDLE_CHECK_S", 0.2)


T = TypeVar("T")


def with_live_streams(url: str, scenario: Callable[[LiveStreams], Awaitable[T]]) -> T:
    """Runs ``scenario`` in a fresh event loop with the API's reader, closed afterwards."""

    async def run() -> T:
        streams = LiveStreams(url)
        try:
            return await scenario(streams)
        finally:
            await streams.close()

    return asyncio.run(run())


async def read_until_end(
    streams: LiveStreams, job_id: str, ends: int = 1, read: list[StreamEntry] | None = None
) -> list[StreamEntry]:
    """Every entry until the ``ends``-th end (into ``read`` as they come), failing after 10 s."""
    read = [] if read is None else read
    async with asyncio.timeout(10):
        async for entry in streams.entries(job_id):
            if entry is not None:
                read.append(entry)
                ends -= entry.end
                if not ends:
                    return read
    return read


def texts(entries: list[StreamEntry]) -> list[tuple[int, str, bool]]:
    return [(e.attempt, e.text, e.end) for e in entries]


def stream_length(url: str, job_id: str) -> int:
    return redis.Redis.from_url(url).xlen(stream_key(job_id))


def subscribers(url: str, job_id: str) -> int:
    """The connections subscribed to the job's channel."""
    return dict(redis.Redis.from_url(url).pubsub_numsub(channel_key(job_id)))[channel_key(job_id).encode()]


async def subscribed(url: str, job_id: str) -> None:
    await async_wait_for(lambda: subscribers(url, job_id) == 1, 5, "the reader to subscribe")


def test_a_reader_gets_what_was_written_so_far_then_each_new_piece_once(
    url: str, job_id: str, streamer: TokenStreamer
) -> None:
    async def scenario(streams: LiveStreams) -> list[StreamEntry]:
        for piece in ("Hello", ",", " wor"):
            streamer.put(job_id, 1, piece, finished=False)
        streamer.flush()
        wait_for(lambda: stream_length(url, job_id) == 3, 5, "the first pieces")
        read: list[StreamEntry] = []
        reader = asyncio.create_task(read_until_end(streams, job_id, read=read))
        # Subscribed, it has read the stream: the rest comes as published pieces.
        await async_wait_for(lambda: len(read) == 3, 5, "the reader to read the stream")
        for piece, finished in (("ld", False), ("!", False), ("", True)):
            streamer.put(job_id, 1, piece, finished)
        streamer.flush()
        return await reader

    read = with_live_streams(url, scenario)
    assert "".join(e.text for e in read) == "Hello, world!"
    assert [e.position for e in read] == [(1, seq) for seq in range(1, 7)] and read[-1].end
    assert redis.Redis.from_url(url).ttl(stream_key(job_id)) > 0


def test_the_writer_streams_again_at_once_after_redis_restarts(tmp_path: Path, job_id: str) -> None:
    """The writes' connection hears no replies, so a server gone and back is found before writing: the
    first piece after the restart is streamed, none lost into the old connection."""
    with private_redis(tmp_path) as server:
        streamer, reader = TokenStreamer(server.url()), redis.Redis.from_url(server.url())
        try:
            streamer.put(job_id, 1, "before", finished=False)
            streamer.flush()
            wait_for(lambda: reader.xlen(stream_key(job_id)) == 1, 5, "the piece before the restart")
            server.stop()
            server.start()
            streamer.put(job_id, 1, "after", finished=True)
            streamer.flush()
            wait_for(lambda: reader.xlen(stream_key(job_id)) == 1, 5, "the piece after the restart")
            assert texts([StreamEntry.from_stream(*e) for e in reader.xrange(stream_key(job_id))]) == [
                (1, "after", True)
            ]
        finally:
            streamer.close()


def test_a_stalled_redis_holds_no_flush_and_gets_every_piece_in_order_once_it_reads(
    tmp_path: Path, job_id: str
) -> None:
    """The engine thread writes its pieces itself. A Redis that stops reading fills the connection's
    buffers; a flush then sends what they take and leaves the rest to the streamer's thread, which
    finishes it on the same connection once Redis reads again: every entry arrives, in order."""
    pieces = [f"{i:04d}" + "x" * 100_000 for i in range(150)]  # ~30 MB: more than the buffers hold
    with private_redis(tmp_path) as server:
        assert server.process is not None
        streamer, reader = TokenStreamer(server.url()), redis.Redis.from_url(server.url())
        resume = threading.Timer(STALL_S, server.process.send_signal, [signal.SIGCONT])
        longest = 0.0
        try:
            streamer.put(job_id, 1, "before", finished=False)
            streamer.flush()
            wait_for(lambda: reader.xlen(stream_key(job_id)) == 1, 5, "the piece before the stall")
            server.process.send_signal(signal.SIGSTOP)
            resume.start()
            for piece in pieces:
                streamer.put(job_id, 1, piece, finished=False)
                started = time.monotonic()
                streamer.flush()
                longest = max(longest, time.monotonic() - started)
            streamer.put(job_id, 1, "after", finished=True)
            streamer.flush()
            wait_for(lambda: reader.xlen(stream_key(job_id)) == 152, 60, "every piece after the stall")
            read = texts([StreamEntry.from_stream(*e) for e in reader.xrange(stream_key(job_id))])
        finally:
            resume.cancel()
            server.process.send_signal(signal.SIGCONT)
            streamer.close()
    assert longest < STALL_S / 2  # a flush that waited for Redis would wait until it reads again
    assert read == [(1, text, text == "after") for text in ["before", *pieces, "after"]]


def test_a_message_lost_on_the_channel_is_read_from_the_stream(url: str, job_id: str) -> None:
    worker = redis.Redis.from_url(url)

    def write(entry: StreamEntry, publish: bool = True) -> None:
        worker.xadd(stream_key(job_id), entry.fields(), id=entry.entry_id)
        if publish:
            worker.publish(channel_key(job_id), entry.message())

    async def scenario(streams: LiveStreams) -> list[StreamEntry]:
        read: list[StreamEntry] = []
        reader = asyncio.create_task(read_until_end(streams, job_id, read=read))
        await subscribed(url, job_id)
        write(StreamEntry(1, 1, "one "))
        await async_wait_for(lambda: len(read) == 1, 5, "the first entry")  # past its first stream read
        write(StreamEntry(1, 2, "two "), publish=False)  # in the stream, but its message is lost
        write(StreamEntry(1, 3, "three", end=True))
        return await reader

    read = with_live_streams(url, scenario)
    assert texts(read) == [(1, "one ", False), (1, "two ", False), (1, "three", True)]


def test_a_requeued_run_starts_over_and_a_stale_run_is_refused(
    url: str, job_id: str, streamer: TokenStreamer
) -> None:
    async def scenario(streams: LiveStreams) -> list[StreamEntry]:
        reader = asyncio.create_task(read_until_end(streams, job_id, ends=2))
        await subscribed(url, job_id)
        streamer.put(job_id, 1, "first", finished=False)
        streamer.put(job_id, 1, " run", finished=True)  # aborted to be requeued
        streamer.flush()
        wait_for(lambda: stream_length(url, job_id) == 2, 5, "the first run")
        streamer.put(job_id, 2, "second", finished=False)
        streamer.flush()
        wait_for(lambda: stream_length(url, job_id) == 3, 5, "the second run")
        streamer.put(job_id, 1, " stale", finished=False)  # the first run, on a worker presumed dead
        streamer.put(job_id, 2, " run", finished=True)
        streamer.flush()
        return await reader

    read = with_live_streams(url, scenario)
    assert texts(read) == [(1, "first", False), (1, " run", True), (2, "second", False), (2, " run", True)]
    stored = redis.Redis.from_url(url).xrange(stream_key(job_id))
    assert b" stale" not in [fields.get(b"text") for _, fields in stored]


def test_readers_of_one_job_share_a_subscription_and_leave_none_behind(
    url: str, job_id: str, streamer: TokenStreamer
) -> None:
    async def scenario(streams: LiveStreams) -> tuple[list[StreamEntry], list[StreamEntry], int]:
        readers = [asyncio.create_task(read_until_end(streams, job_id)) for _ in range(2)]
        await subscribed(url, job_id)  # the first reader; the second joined it in the same turn of the loop
        during = subscribers(url, job_id)
        for piece in ("a", "b", "c"):
            streamer.put(job_id, 1, piece, finished=piece == "c")
        streamer.flush()
        first, second = await asyncio.gather(*readers)
        await async_wait_for(lambda: subscribers(url, job_id) == 0, 5, "the readers to leave no subscription")
        return first, second, during

    first, second, during = with_live_streams(url, scenario)
    assert during == 1
    assert texts(first) == texts(second) == [(1, "a", False), (1, "b", False), (1, "c", True)]


def test_a_quiet_stream_says_so_at_each_idle_check(url: str, job_id: str) -> None:
    async def scenario(streams: LiveStreams) -> list[StreamEntry | None]:
        heard: list[StreamEntry | None] = []
        async with asyncio.timeout(5):
            async for entry in streams.entries(job_id):
                heard.append(entry)
                if len(heard) == 2:
                    break
        return heard

    assert with_live_streams(url, scenario) == [None, None]


def announce(url: str, job_id: str) -> None:
    """What the API does when a reader comes (``LiveStreams.entries``)."""
    pipe = redis.Redis.from_url(url).pipeline()
    announce_reader(pipe, job_id)
    pipe.execute()


def test_a_run_nobody_reads_is_not_streamed_and_a_reader_gets_all_its_text_so_far_first(
    url: str, job_id: str, streamer: TokenStreamer
) -> None:
    streamer.feed(job_id, 1, "Hello", "Hello", finished=False)
    streamer.feed(job_id, 1, ",", "Hello,", finished=False)
    streamer.put(job_id, 0, "", finished=True)  # a marker: the pieces fed before it have been written
    streamer.flush()
    wait_for(lambda: stream_length(url, job_id) == 1, 5, "the marker")
    assert texts(read_stream(url, job_id)) == [(0, "", True)]  # nobody read it: nothing of its run

    async def scenario(streams: LiveStreams) -> list[StreamEntry]:
        read: list[StreamEntry] = []
        reader = asyncio.create_task(read_until_end(streams, job_id, ends=2, read=read))
        await async_wait_for(lambda: streamer.watchers.watched(job_id), 5, "the worker to see the reader")
        streamer.feed(job_id, 1, " wor", "Hello, wor", finished=False)
        streamer.feed(job_id, 1, "ld", "Hello, world", finished=True)
        streamer.flush()
        return await reader

    try:
        read = with_live_streams(url, scenario)
    finally:
        redis.Redis.from_url(url).zrem(WATCHED_KEY, job_id)
    assert texts(read) == [(0, "", True), (1, "Hello, wor", False), (1, "ld", True)]


def test_a_requeued_run_of_a_read_job_starts_with_its_own_text_so_far(
    url: str, job_id: str, streamer: TokenStreamer
) -> None:
    announce(url, job_id)
    try:
        wait_for(lambda: streamer.watchers.watched(job_id), 5, "the worker to see the reader")
        streamer.feed(job_id, 1, "first", "first", finished=True)
        streamer.feed(job_id, 2, "sec", "sec", finished=False)
        streamer.feed(job_id, 2, "ond", "second", finished=True)
        streamer.flush()
        wait_for(lambda: stream_length(url, job_id) == 3, 5, "both runs")
    finally:
        redis.Redis.from_url(url).zrem(WATCHED_KEY, job_id)
    assert texts(read_stream(url, job_id)) == [(1, "first", True), (2, "sec", False), (2, "ond", True)]


def test_a_reader_announces_itself_until_it_leaves(url: str, job_id: str) -> None:
    async def scenario(streams: LiveStreams) -> float | None:
        async with asyncio.timeout(5):
            async for _ in streams.entries(job_id):  # the first idle check
                return redis.Redis.from_url(url).zscore(WATCHED_KEY, job_id)
        return None

    try:
        until = with_live_streams(url, scenario)
    finally:
        redis.Redis.from_url(url).zrem(WATCHED_KEY, job_id)
    assert until is not None and time.time() < until <= time.time() + WATCH_TTL_S


def read_stream(url: str, job_id: str) -> list[StreamEntry]:
    entries = redis.Redis.from_url(url).xrange(stream_key(job_id))
    return [StreamEntry.from_stream(entry_id, fields) for entry_id, fields in entries]


def test_a_resumed_runs_first_entry_says_so_on_the_channel_and_in_the_stream(
    url: str, job_id: str, streamer: TokenStreamer
) -> None:
    async def scenario(streams: LiveStreams) -> list[StreamEntry]:
        reader = asyncio.create_task(read_until_end(streams, job_id))
        await subscribed(url, job_id)
        streamer.put(job_id, 1, "first", finished=False)  # then its worker dies
        streamer.flush()
        wait_for(lambda: stream_length(url, job_id) == 1, 5, "the first run")
        streamer.put(job_id, 2, "fir", finished=False, resumed=True)  # the text flushed before the crash
        streamer.put(job_id, 2, "st run", finished=True)
        streamer.flush()
        return await reader

    read = with_live_streams(url, scenario)
    assert [(e.attempt, e.text, e.resumed) for e in read] == [
        (1, "first", False),
        (2, "fir", True),
        (2, "st run", False),
    ]
    stored = redis.Redis.from_url(url).xrange(stream_key(job_id))
    assert [StreamEntry.from_stream(i, f).resumed for i, f in stored] == [False, True, False]


def test_a_reader_continues_a_resumed_run_and_starts_a_restarted_one_over() -> None:
    reader = Continuation()

    def events(entry: StreamEntry) -> list[tuple[str, dict]]:
        return [(e.event, e.data) for e in reader.take(entry)]

    assert events(StreamEntry(1, 1, "Hello wor")) == [("delta", {"text": "Hello wor"})]
    # the new run repeats the flushed "Hello" (less than was sent), then goes on: only "ld!" is new
    assert events(StreamEntry(2, 1, "Hello", resumed=True)) == []
    assert events(StreamEntry(2, 2, " wo")) == []
    assert events(StreamEntry(2, 3, "rld!")) == [("delta", {"text": "ld!"})]
    assert events(StreamEntry(3, 1, "Hi")) == [("restart", {"attempt": 3}), ("delta", {"text": "Hi"})]


def test_many_readers_at_once_wait_their_turn_for_a_connection(url: str) -> None:
    """More readers than the client's connection pool holds, all reading the stream in the same turn of the
    loop (a batch's 256 followers): each waits for a connection rather than failing mid-stream."""
    jobs = [f"job_test_{uuid.uuid4().hex[:12]}" for _ in range(4 * live.REDIS_CONNECTIONS)]
    writer = redis.Redis.from_url(url)
    for job in jobs:
        writer.xadd(stream_key(job), StreamEntry(1, 1, job, end=True).fields(), id="1-1")

    async def scenario(streams: LiveStreams) -> list[list[StreamEntry]]:
        return await asyncio.gather(*(read_until_end(streams, job) for job in jobs))

    try:
        read = with_live_streams(url, scenario)
    finally:
        writer.delete(*(stream_key(job) for job in jobs))
    assert [texts(entries) for entries in read] == [[(1, job, True)] for job in jobs]
