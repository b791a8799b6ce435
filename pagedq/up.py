"""``pagedq up``: migrate, start a worker and the webhook sender as children, serve the API in this
process, and say in one line when the whole service can take work."""

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from core.settings import Settings
from pagedq.serve import bootstrap_keys, env_for, migrate, serve_api

logger = logging.getLogger("pagedq")

READY = "pagedq is ready"


class DataDirInUse(Exception):
    pass


def up(settings: Settings) -> int:
    try:
        with data_dir_lock(settings.data_dir):
            return _run(settings)
    except DataDirInUse as error:
        print(f"pagedq: {error}", file=sys.stderr)
        return 1


def _run(settings: Settings) -> int:
    from worker.engine.default_model import resolve_model

    migrate(settings)
    if not bootstrap_keys(settings):
        return 1
    resolve_model(settings.model)  # build the default model once, before the worker and the API want it
    url = settings.listen_url
    model = settings.served_model_name
    access = (
        "API keys required" if settings.auth_required else f"open, no API keys, to all on {settings.host}"
    )
    _say(f"starting the API on {url} ({access}) and a worker, which loads {model} first; wait for '{READY}'")
    ready_read, ready_write = os.pipe()
    children = {
        "worker": _child(settings, "worker", "--ready-fd", str(ready_write), pass_fds=(ready_write,)),
        "webhooks": _child(settings, "webhooks"),
    }
    os.close(ready_write)
    api_stopping = threading.Event()
    threading.Thread(target=_announce_when_ready, args=(url, ready_read, api_stopping), daemon=True).start()
    for name, child in children.items():
        threading.Thread(target=_stop_when_child_dies, args=(name, child, api_stopping), daemon=True).start()
    try:
        return serve_api(settings)
    finally:
        api_stopping.set()
        _stop_children(children, settings.shutdown_grace)


@contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """One ``pagedq up`` per data folder (two would share its SQLite file and broker folder): an flock on
    ``<data dir>/pagedq.lock``, held for the life of this process, which names its holder."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "pagedq.lock").open("a+") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            raise DataDirInUse(
                f"{data_dir} is in use by another `pagedq up` ({file.read().strip() or 'pid unknown'}); "
                "stop that one, or give this one a folder of its own with PAGEDQ_DATA_DIR"
            ) from None
        file.truncate(0)
        file.write(f"pid {os.getpid()}\n")
        file.flush()
        yield


def _child(settings: Settings, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pagedq", *args]  # stdout: Celery's notes on shutting down
    return subprocess.Popen(command, env=env_for(settings), pass_fds=pass_fds, stdout=subprocess.DEVNULL)


def _announce_when_ready(url: str, ready_read: int, api_stopping: threading.Event) -> None:
    """After the worker's line on ``ready_read`` (it consumes) and a 200 from /readyz, the ready line."""
    with os.fdopen(ready_read) as announcement:
        line = announcement.readline()
    if not line:  # the worker died first; _stop_when_child_dies reports it
        return
    while not api_stopping.wait(0.2):
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            continue
    else:
        return
    worker = json.loads(line)
    logger.info("service ready", extra={"api": url} | worker)
    print(ready_lines(url, worker), flush=True)


def ready_lines(url: str, worker: dict[str, Any]) -> str:
    """The ready line, then the README's first request and where to watch it."""
    kv = f"{worker['kv_cache_bytes'] / 2**30:.2f} GiB ({worker['kv_cache_blocks']} blocks)"
    return (
        f"{READY}: API {url}, worker {worker['worker_id']}, model {worker['model']} on {worker['device']} "
        f"({worker['dtype']}, context {worker['max_model_len']}), KV cache {kv}\n"
        "Try:\n"
        f"  curl -s {url}/v1/jobs -H 'Content-Type: application/json' -H 'Prefer: wait=30' \\\n"
        """    -d '{"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 64}'"""
        f"\nand watch it in the console: {url}/console"
    )


def _stop_when_child_dies(name: str, child: subprocess.Popen[bytes], api_stopping: threading.Event) -> None:
    code = child.wait()
    if code != 0 and not api_stopping.is_set():  # 0: it drained on a signal that reaches the API too
        logger.error("a child process exited; stopping the API", extra={"child": name, "exit_code": code})
        os.kill(os.getpid(), signal.SIGTERM)


def _stop_children(children: dict[str, subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM: running jobs get ``grace`` seconds to finish, then are requeued. A Ctrl-C (or SIGTERM)
    meanwhile tells the worker to requeue them at once (SIGUSR2); one more kills the children."""
    steps = [
        (
            signal.SIGTERM,
            f"stopping; running jobs get up to {grace:g} s to finish, then go back to the "
            "queue (Ctrl-C again: requeue them now)",
        ),
        (signal.SIGUSR2, "requeueing running jobs and stopping now (Ctrl-C again: kill at once)"),
        (signal.SIGKILL, "killed; running jobs go back to the queue when a worker starts again"),
    ]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    for sig, message in steps:
        if all(child.poll() is not None for child in children.values()):
            return
        _say(message)
        try:
            for name, child in children.items():
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM if sig == signal.SIGUSR2 and name != "worker" else sig)
            for child in children.values():
                child.wait()
            return
        except Interrupted:
            continue


class Interrupted(Exception):
    """Ctrl-C or SIGTERM while the children stop."""


def _interrupt(*_: object) -> None:
    raise Interrupted


def _say(message: str) -> None:
    """A line for the person at the terminal (logs are for machines)."""
    print(f"pagedq: {message}", file=sys.stderr, flush=True)
