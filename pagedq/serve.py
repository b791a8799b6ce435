"""The service commands: ``pagedq up`` (embedded), ``api``, ``worker``, ``webhooks`` and ``migrate``."""

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn

from core.settings import Settings

logger = logging.getLogger("pagedq")


def migrate(settings: Settings) -> None:
    from migrations import upgrade

    upgrade(settings)
    logger.info("database is at the latest revision", extra={"database": _redacted(settings)})


def serve_api(settings: Settings) -> None:
    from api.app import create_app
    from worker.engine.default_model import resolve_model

    app = create_app(settings, resolve_model(settings.model))
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
    GracefulServer(config).run()


class GracefulServer(uvicorn.Server):
    """Stops on SIGINT/SIGTERM and returns (uvicorn re-raises them), so ``up`` can drain its worker."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(*_: object) -> None:
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve_worker(settings: Settings) -> None:
    from worker.main import run_worker

    run_worker(settings)


def serve_webhooks(settings: Settings) -> None:
    from worker.webhooks import run_webhooks

    run_webhooks(settings)


def up(settings: Settings) -> None:
    """API, worker and webhook sender: migrate, start the worker and the sender as children, serve the API
    in this process."""
    from worker.engine.default_model import resolve_model

    migrate(settings)
    resolve_model(settings.model)  # build the default model once, before two processes want it
    children = {
        name: subprocess.Popen([sys.executable, "-m", "pagedq", name], env=_env_for(settings))
        for name in ("worker", "webhooks")
    }
    api_stopping = threading.Event()
    for name, child in children.items():
        threading.Thread(target=_stop_when_child_dies, args=(name, child, api_stopping), daemon=True).start()
    try:
        serve_api(settings)
    finally:
        api_stopping.set()
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children.values():
            child.wait()


def _env_for(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["PAGEDQ_DATABASE_URL"] = settings.resolved_database_url
    env["PAGEDQ_BROKER_URL"] = settings.resolved_broker_url
    return env


def _stop_when_child_dies(name: str, child: subprocess.Popen[bytes], api_stopping: threading.Event) -> None:
    code = child.wait()
    if code != 0 and not api_stopping.is_set():  # 0: it drained on a signal that reaches the API too
        logger.error("a child process exited; stopping the API", extra={"process": name, "exit_code": code})
        os.kill(os.getpid(), signal.SIGTERM)


def _redacted(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    url = settings.resolved_database_url
    return make_url(url).render_as_string(hide_password=True) if "://" in url else str(Path(url))
