"""The service commands: ``pagedq up`` (embedded), ``api``, ``worker`` and ``migrate``."""

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


def up(settings: Settings) -> None:
    """API and worker together: migrate, start the worker as a child, serve the API in this process."""
    from worker.engine.default_model import resolve_model

    migrate(settings)
    resolve_model(settings.model)  # build the default model once, before two processes want it
    worker = subprocess.Popen([sys.executable, "-m", "pagedq", "worker"], env=_env_for(settings))
    api_stopping = threading.Event()
    threading.Thread(target=_stop_when_worker_dies, args=(worker, api_stopping), daemon=True).start()
    try:
        serve_api(settings)
    finally:
        api_stopping.set()
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait()


def _env_for(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["PAGEDQ_DATABASE_URL"] = settings.resolved_database_url
    env["PAGEDQ_BROKER_URL"] = settings.resolved_broker_url
    return env


def _stop_when_worker_dies(worker: subprocess.Popen[bytes], api_stopping: threading.Event) -> None:
    code = worker.wait()
    if code != 0 and not api_stopping.is_set():  # 0: it drained on a signal that reaches the API too
        logger.error("the worker exited; stopping the API", extra={"exit_code": code})
        os.kill(os.getpid(), signal.SIGTERM)


def _redacted(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    url = settings.resolved_database_url
    return make_url(url).render_as_string(hide_password=True) if "://" in url else str(Path(url))
