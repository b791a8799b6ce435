"""``GET /v1/jobs/{id}/events``: a job's text as it is produced, then the finished job.

Events: ``delta`` ``{"text"}`` for each new piece (first everything produced so far), ``restart``
``{"attempt"}`` when a requeued job starts over, and finally ``job`` with the job as ``GET`` returns it.
With Redis the pieces come as the worker publishes them (``api/jobs/live.py``), after what its Redis stream
already holds (the worker streams a run once a reader follows it, its first entry all the text so far);
without (the embedded mode), and for a job that has ended, from the job row's output, which the worker
flushes every flush interval.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing

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


async def job_events(service: Service, job: Job) -> AsyncIterator[ServerSentEvent]:
    # A batch's jobs are never streamed live, and a job that has ended has its output whole in its row.
    if service.live is None or job.batch_id is not None or job.status in TERMINAL:
        events = _from_row(service, job.id)
    else:
        events = _from_stream(service, service.live, job.id)
    async for event in events:
        yield event


async def _from_stream(service: Service, live: LiveStreams, job_id: str) -> AsyncIterator[ServerSentEvent]:
    attempt, streamed = None, False
    async with aclosing(live.entries(job_id)) as entries:  # unsubscribes as soon as this ends
        async for entry in entries:
            if entry is not None:
                if attempt is not None and entry.attempt != attempt:
                    yield ServerSentEvent(event="restart", data={"attempt": entry.attempt})
                attempt = entry.attempt
                if entry.text:
                    streamed = True
                    yield ServerSentEvent(event="delta", data={"text": entry.text})
            if entry is None or entry.end:
                job = await _settled(service, job_id, wait=entry is not None)
                if job.status in TERMINAL:
                    if not streamed and job.output_text:  # the stream expired: send the output whole
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
        if attempt is not None and job.attempt != attempt:
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


async def encoded(events: AsyncIterator[ServerSentEvent]) -> AsyncIterator[bytes]:
    """The SSE wire format of ``events`` (their data as JSON)."""
    async for event in events:
        data = event.data
        text = data.model_dump_json() if isinstance(data, BaseModel) else json.dumps(data, ensure_ascii=False)
        yield format_sse_event(data_str=text, event=event.event)
