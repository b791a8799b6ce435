"""``GET /v1/jobs/{id}/events``: a job's text as it is produced, then the finished job.

Events: ``delta`` ``{"text"}`` for each new piece (first everything produced so far), ``restart``
``{"attempt"}`` when a requeued job starts over (one that resumes from its flushed tokens continues, with
no event), and finally ``job`` with the job as ``GET`` returns it.
With Redis the pieces come as the worker publishes them (``api/jobs/live.py``), after what its Redis stream
already holds (the worker streams a run once a reader follows it, its first entry all the text so far);
without (the embedded mode), and for a job that has ended, from the job row's output, which the worker
flushes every flush interval.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi.sse import ServerSentEvent, format_sse_event
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from api.deps import Service
from api.http.caller import OPEN  # a stream's job was found for its caller when the stream began
from api.jobs import queries as jobs
from api.jobs.live import LiveStreams
from api.jobs.schemas import JobOut
from core.models import Job
from core.states import TERMINAL
from core.streams import StreamEntry


async def job_events(service: Service, job: Job) -> AsyncIterator[ServerSentEvent]:
    # A batch's jobs are never streamed live, and a job that has ended has its output whole in its row.
    if service.live is None or job.batch_id is not None or job.status in TERMINAL:
        events = _from_row(service, job.id)
    else:
        events = _from_stream(service, service.live, job.id)
    async for event in events:
        yield event


@dataclass
class Continuation:
    """What a reader sends of each entry: a new run that starts over is a ``restart``; one that resumes
    repeats the text so far before going on, so what the reader has sent of it is skipped."""

    attempt: int | None = None
    sent: int = 0  # characters sent, of the current text
    skip: int = 0  # characters of the resumed run's text still to skip

    def take(self, entry: StreamEntry) -> Iterator[ServerSentEvent]:
        if self.attempt is not None and entry.attempt != self.attempt:
            if entry.resumed:
                self.skip = self.sent
            else:
                yield ServerSentEvent(event="restart", data={"attempt": entry.attempt})
                self.sent = self.skip = 0
        self.attempt = entry.attempt
        text, self.skip = entry.text[self.skip :], max(self.skip - len(entry.text), 0)
        if text:
            self.sent += len(text)
            yield ServerSentEvent(event="delta", data={"text": text})


async def _from_stream(service: Service, live: LiveStreams, job_id: str) -> AsyncIterator[ServerSentEvent]:
    reader = Continuation()
    async with aclosing(live.entries(job_id)) as entries:  # unsubscribes as soon as this ends
        async for entry in entries:
            if entry is not None:
                for event in reader.take(entry):
                    yield event
            if entry is None or entry.end:
                job = await _settled(service, job_id, wait=entry is not None)
                if job.status in TERMINAL:
                    if not reader.sent and job.output_text:  # the stream expired: send the output whole
                        yield ServerSentEvent(event="delta", data={"text": job.output_text})
                    yield ServerSentEvent(event="job", data=JobOut.of(job))
                    return


async def _settled(service: Service, job_id: str, wait: bool) -> Job:
    """The job row; after a run's last token, give the worker a moment to commit the final state."""
    if wait:
        await service.waiter.wait(job_id, timeout=5.0)
    return await run_in_threadpool(jobs.get, service, OPEN, job_id)


async def _from_row(service: Service, job_id: str) -> AsyncIterator[ServerSentEvent]:
    sent, attempt = "", None
    while True:
        job = await run_in_threadpool(jobs.get, service, OPEN, job_id)
        # Only a reader that has text of an earlier run has something to start over: one that began while
        # the job was queued sees its first run start, not a restart.
        if sent and job.attempt != attempt and not resumed(job):
            yield ServerSentEvent(event="restart", data={"attempt": job.attempt})
            sent = ""
        attempt = job.attempt
        if len(job.output_text) > len(sent):
            yield ServerSentEvent(event="delta", data={"text": job.output_text[len(sent) :]})
            sent = job.output_text
        if job.status in TERMINAL:
            yield ServerSentEvent(event="job", data=JobOut.of(job))
            return
        await asyncio.sleep(service.settings.flush_interval)


def resumed(job: Job) -> bool:
    """Whether the job's current run goes on from an earlier one's tokens (its text is kept)."""
    return bool(job.runs) and job.runs[-1]["resumed_from_token"] > 0


async def encoded(events: AsyncIterator[ServerSentEvent]) -> AsyncIterator[bytes]:
    """The SSE wire format of ``events`` (their data as JSON)."""
    async for event in events:
        data = event.data
        text = data.model_dump_json() if isinstance(data, BaseModel) else json.dumps(data, ensure_ascii=False)
        yield format_sse_event(data_str=text, event=event.event)
