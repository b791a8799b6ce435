"""The service commands ``api``, ``worker``, ``webhooks`` and ``migrate`` (``pagedq up`` composes them)."""

import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from uvicorn.supervisors import Multiprocess

from core.served_models import ModelEntry, ModelsError, served_models
from core.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger("pagedq")


def migrate(settings: Settings) -> None:
    from migrations import upgrade

    upgrade(settings)
    logger.info("database is at the latest revision", extra={"database": _redacted(settings)})


def serve_api(settings: Settings) -> int:
    """Refuses to start (1) when auth is required and there is no key nor ``PAGEDQ_ADMIN_KEY``."""
    from api.app import create_app

    if not bootstrap_keys(settings):
        return 1
    logger.info("auth " + auth_mode(settings), extra={"host": settings.host})
    try:
        entries = served_models(settings)
    except ModelsError as error:
        print(f"pagedq: {error}", file=sys.stderr)
        return 1
    if not prepare_models(entries):  # built-in models built once, before any child wants them
        return 1
    options = {"host": settings.host, "port": settings.port, "log_config": None, "access_log": False}
    if settings.api_workers <= 1:
        GracefulServer(uvicorn.Config(create_app(settings, model_dir), **options)).run()
        return 0
    # uvicorn's supervisor spawns each process afresh: they import api_app, which reads the settings
    # from the environment, so the parent's are put there first.
    os.environ.update(env_for(settings))
    config = uvicorn.Config("pagedq.serve:api_app", factory=True, workers=settings.api_workers, **options)
    PatientMultiprocess(config, sockets=[config.bind_socket()]).run()
    return 0


def bootstrap_keys(settings: Settings) -> bool:
    """With auth required and no key, the admin key of ``PAGEDQ_ADMIN_KEY`` is made; False (and why, on
    stderr) when there is none: the API must not open without a key."""
    from sqlalchemy.exc import SQLAlchemyError

    from core import keys
    from core.db import make_db_engine, make_sessionmaker

    engine = make_db_engine(settings)
    try:
        made = keys.bootstrap(make_sessionmaker(engine), settings)
    except keys.NoAdminKey as error:
        print(f"pagedq: {error}", file=sys.stderr)
        return False
    except SQLAlchemyError as error:
        reason = next(iter(str(error).splitlines()), "")
        print(
            f"pagedq: cannot read the API keys ({reason}); is the database migrated (pagedq migrate)?",
            file=sys.stderr,
        )
        return False
    finally:
        engine.dispose()
    if made:
        logger.info("made the admin key of PAGEDQ_ADMIN_KEY", extra={"key_name": made})
    return True


def auth_mode(settings: Settings) -> str:
    if settings.auth_required:
        return "required: every route but /healthz takes an API key (pagedq keys)"
    return f"off: open to anyone who can reach {settings.host} (PAGEDQ_AUTH=required to need keys)"


def api_app() -> "FastAPI":
    """The app of one of several API processes (``PAGEDQ_API_WORKERS`` > 1)."""
    from api.app import create_app
    from pagedq.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)  # a spawned process starts with none set up
    return create_app(settings, model_dir)


def prepare_models(entries: list[ModelEntry]) -> bool:
    """Each model's directory made ready (a built-in one built, a .gguf file's config and tokenizer
    prepared); False (and which model, why, on stderr) when one cannot be served."""
    for entry in entries:
        try:
            model_dir(entry)
        except (OSError, ValueError) as error:  # GGUFError is a ValueError naming the file
            print(f"pagedq: model {entry.name!r} cannot be served: {error}", file=sys.stderr)
            return False
    return True


def model_dir(entry: ModelEntry) -> Path:
    """A served model's Hugging Face directory (its tokenizer, config, weights): a built-in one is
    built in the cache on first use, a .gguf file's config and tokenizer are prepared there."""
    from worker.engine.default_model import resolve_model

    return resolve_model(entry.source, gguf=entry.quantization == "gguf")


class PatientMultiprocess(Multiprocess):
    """uvicorn's supervisor that lets an API process take as long as it needs to start.

    uvicorn pings every process every half second and kills one that does not answer within
    ``timeout_worker_healthcheck`` (5 s), but a process answers only once its interpreter is up and
    it has unpickled its target: on a loaded box a slow start is killed and replaced, again and again.
    Here a process is pinged only once it serves; until then it only has to be alive."""

    def keep_subprocess_alive(self) -> None:
        starting = [p for p in self.processes if p.process.is_alive() and not p.is_ready(timeout=0.05)]
        self.processes = [p for p in self.processes if p not in starting]
        try:
            super().keep_subprocess_alive()
        finally:
            self.processes += starting


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


def serve_worker(settings: Settings, ready_fd: int | None = None, model: str | None = None) -> int:
    """Refuses to start (1) for a model that is not served here, or one this build cannot serve; exits
    with Celery's status (not 0 when its consumer failed, so that `pagedq up` or a supervisor sees it)."""
    from worker.main import run_worker

    try:
        status = run_worker(settings, ready_fd, model)
    except ModelsError as error:
        print(f"pagedq: {error}", file=sys.stderr)
        return 1
    # Its results are written and it has left the workers table: skip the interpreter's teardown (seconds
    # of torch's on a busy machine, with perhaps an engine step still running), which the grace promised.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def serve_webhooks(settings: Settings) -> None:
    from worker.webhooks import run_webhooks

    run_webhooks(settings)


def env_for(settings: Settings) -> dict[str, str]:
    """This environment, with the settings given on the command line or resolved here made explicit."""
    env = dict(os.environ)
    env["PAGEDQ_DATABASE_URL"] = settings.resolved_database_url
    env["PAGEDQ_BROKER_URL"] = settings.resolved_broker_url
    env["PAGEDQ_HOST"], env["PAGEDQ_PORT"] = settings.host, str(settings.port)
    return env


def _redacted(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    url = settings.resolved_database_url
    return make_url(url).render_as_string(hide_password=True) if "://" in url else str(Path(url))
