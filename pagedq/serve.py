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
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.supervisors import Multiprocess

from core.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger("pagedq")


def migrate(settings: Settings) -> None:
    from migrations import upgrade

    upgrade(settings)
    logger.info("database is at the latest revision", extra={"database": _redacted(settings)})


def serve_api(settings: Settings) -> None:
    from api.app import create_app
    from worker.engine.default_model import resolve_model

    model_dir = resolve_model(settings.model)  # build the default model once, before any child wants it
    options = {"host": settings.host, "port": settings.port, "log_config": None, "access_log": False}
    if settings.api_workers <= 1:
        GracefulServer(uvicorn.Config(create_app(settings, model_dir), **options)).run()
        return
    # uvicorn's supervisor spawns each process afresh: they import api_app, which reads the settings
    # from the environment, so the parent's are put there first.
    os.environ.update(_env_for(settings))
    config = uvicorn.Config("pagedq.serve:api_app", factory=True, workers=settings.api_workers, **options)
    Multiprocess(config, sockets=[config.bind_socket()]).run()


def api_app() -> "FastAPI":
    """The app of one of several API processes (``PAGEDQ_API_WORKERS`` > 1)."""
    from api.app import create_app
    from pagedq.cli import configure_logging
    from worker.engine.default_model import resolve_model

    settings = Settings()
    configure_logging(settings.log_level)  # a spawned process starts with no logging set up
    return create_app(settings, resolve_model(settings.model))


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
    resolve_model(settings.model)  # build the default model once, before the worker and the API want it
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
    """This environment, with the settings given on the command line or resolved here made explicit."""
    env = dict(os.environ)
    env["PAGEDQ_DATABASE_URL"] = settings.resolved_database_url
    env["PAGEDQ_BROKER_URL"] = settings.resolved_broker_url
    env["PAGEDQ_HOST"], env["PAGEDQ_PORT"] = settings.host, str(settings.port)
    return env


def _stop_when_child_dies(name: str, child: subprocess.Popen[bytes], api_stopping: threading.Event) -> None:
    code = child.wait()
    if code != 0 and not api_stopping.is_set():  # 0: it drained on a signal that reaches the API too
        logger.error("a child process exited; stopping the API", extra={"child": name, "exit_code": code})
        os.kill(os.getpid(), signal.SIGTERM)


def _redacted(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    url = settings.resolved_database_url
    return make_url(url).render_as_string(hide_password=True) if "://" in url else str(Path(url))
