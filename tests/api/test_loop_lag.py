"""Nothing a batch request does holds the API's event loop: creating and cancelling a 50,000-line batch
through the real API over HTTP, with asyncio's debug mode reporting every slow callback. Before startup's
heap was frozen (api/app.py), the full collections such a batch sets off stopped the loop 0.3-0.65 s."""

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from sqlalchemy import func, select

from api.app import create_app
from core.models import Job
from core.settings import Settings
from tests.support.jobs_client import Database
from tests.support.services import wait_for

SLOW = 0.25  # seconds: far above the ~50 ms budget (a loaded machine), below the stalls seen before
LINES = 50_000  # as in the issue: enough allocation to set off several full collections


class SlowCallbacks(logging.Handler):
    """asyncio's debug-mode warnings: "Executing <Handle ...> took 0.312 seconds"."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "took" in (message := record.getMessage()):
            self.seen.append(message)


@contextmanager
def api_in_debug_mode(settings: Settings, slow: SlowCallbacks) -> Iterator[str]:
    """The API over real HTTP on an event loop in asyncio's debug mode, in a thread of this process."""
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, Path(settings.model)), port=0, log_config=None, access_log=False)
    )

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        loop.slow_callback_duration = SLOW

        async def tick() -> None:  # a callback every 10 ms: a pause of every thread lands in one of them
            while True:
                await asyncio.sleep(0.01)

        task = loop.create_task(tick())
        await server.serve()
        task.cancel()

    watched = logging.getLogger("asyncio")
    watched.addHandler(slow)
    thread = threading.Thread(target=lambda: asyncio.run(serve(), debug=True), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30, "the API to start")
        slow.seen.clear()  # startup's own work (a full collection before serving) is not a request's
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        watched.removeHandler(slow)


def batch_file(lines: int) -> bytes:
    body = {"max_tokens": 8, "temperature": 0}
    return "".join(
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": f"The quick brown fox {i}"}]} | body,
            }
        )
        + "\n"
        for i in range(lines)
    ).encode()


def test_creating_and_cancelling_a_big_batch_never_holds_the_event_loop(service_settings: Settings) -> None:
    slow = SlowCallbacks()
    with api_in_debug_mode(service_settings, slow) as url, httpx.Client(base_url=url, timeout=120) as http:
        files = {"file": ("input.jsonl", batch_file(LINES))}
        uploaded = http.post("/v1/files", files=files, data={"purpose": "batch"}).json()
        created = http.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
        assert created["status"] == "in_progress" and created["request_counts"]["total"] == LINES
        cancelled = http.post(f"/v1/batches/{created['id']}/cancel").json()
        assert cancelled["status"] == "cancelling" and cancelled["request_counts"]["failed"] == LINES
    db = Database(service_settings)
    try:
        with db.sessions() as session:
            query = select(Job.status, func.count()).where(Job.batch_id == created["id"]).group_by(Job.status)
            assert dict(session.execute(query).all()) == {"cancelled": LINES}
    finally:
        db.close()
    assert slow.seen == []
