"""Live token streams: the worker appends each job's new text to a Redis stream and publishes it; the
API follows it.

A Redis stream keeps what was produced so far, so a client that connects late reads it from the start;
the same entry is published on the job's channel, which one pub/sub connection per API process
receives for every job it streams (a blocking read per stream and token cost several times more). An
entry's id is ``<attempt>-<seq>``: entries are ordered by run, then by their place in it, so a reader
drops what it has seen, notices a gap (a message lost while reconnecting) and fills it from the
stream, and knows when a requeued job starts over. Without Redis (``pagedq up``) there is no stream
and the API follows the job row's partial output instead.
"""

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from core.settings import Settings

logger = logging.getLogger(__name__)

STREAM_TTL_S = 3600  # a finished job's stream is kept this long for late readers
WATCHED_KEY = "pagedq:watched"  # job id -> until when (unix seconds) a reader is there
WATCHING_CHANNEL = "pagedq:watching"  # a job id, as soon as a reader comes
WATCH_TTL_S = 30.0  # a reader's presence lasts this long (clocks of hosts may differ by some seconds)
WATCH_RENEW_S = 10.0  # and is renewed this often while it reads
ENDED_CHANNEL = "pagedq:ended"  # the ids of jobs whose end is committed (``ended_ids`` reads them)


def announce_reader(pipe: Any, job_id: str) -> None:
    """Queue on a Redis pipeline (sync or asyncio) that a reader follows ``job_id``, for WATCH_TTL_S."""
    pipe.zadd(WATCHED_KEY, {job_id: time.time() + WATCH_TTL_S}, gt=True)
    pipe.publish(WATCHING_CHANNEL, job_id)


def stream_key(job_id: str) -> str:
    return f"pagedq:stream:{job_id}"


def channel_key(job_id: str) -> str:
    return f"pagedq:live:{job_id}"


def streams_url(settings: Settings) -> str | None:
    url = settings.resolved_broker_url
    return url if url.startswith(("redis://", "rediss://")) else None


def ended_ids(message: bytes) -> list[str]:
    """The job ids of an ``ENDED_CHANNEL`` message, as ``end_announcer`` sends them."""
    return message.decode().split(",")


def end_announcer(settings: Settings) -> Callable[[list[str]], None] | None:
    """Announces jobs whose end is committed (``ENDED_CHANNEL``); best effort, as waiters also poll."""
    return _on_jobs(
        settings,
        lambda client, job_ids: client.publish(ENDED_CHANNEL, ",".join(job_ids)),
        "could not announce ended jobs",
    )


def stream_dropper(settings: Settings) -> Callable[[list[str]], None] | None:
    """Deletes jobs' streams (retention, ``DELETE``); best effort, as a stream expires within the hour."""
    return _on_jobs(
        settings,
        lambda client, job_ids: client.delete(*(stream_key(job_id) for job_id in job_ids)),
        "could not delete job streams",
    )


def _on_jobs(
    settings: Settings, command: Callable[[redis.Redis, list[str]], object], failure: str
) -> Callable[[list[str]], None] | None:
    """``command`` for a list of job ids on a client of the streams' Redis, a failure logged as ``failure``
    and not raised; None without Redis."""
    url = streams_url(settings)
    if url is None:
        return None
    client = redis.Redis.from_url(url)

    def run(job_ids: list[str]) -> None:
        try:
            command(client, job_ids)
        except redis.RedisError as error:
            logger.warning(failure, extra={"jobs": len(job_ids), "error": str(error)})

    return run


@dataclass(frozen=True)
class StreamEntry:
    """One entry of a job's stream: the ``seq``-th piece of text of run ``attempt``, or its end, or both."""

    attempt: int
    seq: int  # from 1 within a run
    text: str = ""
    end: bool = False
    # A run's first entry when it goes on from an earlier run (a resume after a crash): its text is the
    # earlier run's flushed text, which the new run continues, so readers skip what they have read.
    resumed: bool = False

    @property
    def entry_id(self) -> str:
        return f"{self.attempt}-{self.seq}"

    @property
    def position(self) -> tuple[int, int]:
        return self.attempt, self.seq

    def follows(self, position: tuple[int, int]) -> bool:
        """Whether this is the very next entry after ``position``: nothing lies between them."""
        attempt, seq = position
        return (self.attempt == attempt and self.seq == seq + 1) or (self.attempt > attempt and self.seq == 1)

    def fields(self) -> dict[str, str | int]:
        resumed = {"resumed": 1} if self.resumed else {}
        return ({"text": self.text} if self.text else {}) | ({"end": 1} if self.end else {}) | resumed

    def message(self) -> str:
        return json.dumps({"id": self.entry_id} | self.fields(), ensure_ascii=False)

    @classmethod
    def from_message(cls, data: bytes | str) -> "StreamEntry":
        fields = json.loads(data)
        return cls._of(fields.pop("id"), fields)

    @classmethod
    def from_stream(cls, entry_id: bytes, fields: dict[bytes, bytes]) -> "StreamEntry":
        return cls._of(entry_id.decode(), {key.decode(): value.decode() for key, value in fields.items()})

    @classmethod
    def _of(cls, entry_id: str, fields: dict[str, Any]) -> "StreamEntry":
        attempt, seq = entry_id.split("-")
        return cls(int(attempt), int(seq), fields.get("text", ""), "end" in fields, "resumed" in fields)
