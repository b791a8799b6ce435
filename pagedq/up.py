"""``pagedq up``: migrate, start each served model's workers and the webhook sender as children, serve the
API in this process, and say in one line per model when the whole service can take work."""

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

from core.queue import queue_name
from core.served_models import ModelEntry, ModelsError, served_models
from core.settings import Settings
from pagedq.serve import bootstrap_keys, env_for, migrate, prepare_models, serve_api

logger = logging.getLogger("pagedq")

READY = "pagedq is ready"


class DataDirInUse(Exception):
    pass


def up(settings: Settings) -> int:
    try:
        with data_dir_lock(settings.data_dir):
            return _run(settings)
    except (DataDirInUse, ModelsError) as error:
        print(f"pagedq: {error}", file=sys.stderr)
        return 1


def _run(settings: Settings) -> int:
    migrate(settings)
    if not bootstrap_keys(settings):
        return 1
    entries = [entry for entry in served_models(settings) if entry.workers > 0]
    if not prepare_models(entries):  # built-in models built once, before the workers and the API want them
        return 1
    url = settings.listen_url
    access = (
        "API keys required" if settings.auth_required else f"open, no API keys, to all on {settings.host}"
    )
    workers = ", ".join(f"{entry.workers} for {entry.name}" for entry in entries)
    _say(
        f"starting the API on {url} ({access}) and workers ({workers}), which load their models "
        f"first; wait for '{READY}'"
    )
    children, ready_reads = _workers(settings, entries)
    children["webhooks"] = _child(settings, "webhooks")
    api_stopping = threading.Event()
    threading.Thread(target=_announce_when_ready, args=(url, ready_reads, api_stopping), daemon=True).start()
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


def _workers(
    settings: Settings, entries: list[ModelEntry]
) -> tuple[dict[str, subprocess.Popen[bytes]], list[int]]:
    """``entry.workers`` worker processes per model, each with a status file of its own; the first of
    each model says on a pipe of its own when it consumes (the read ends are returned)."""
    children, ready_reads = {}, []
    for entry in entries:
        for i in range(entry.workers):
            status = settings.data_dir / f"worker-status-{queue_name(entry.name)}-{i}.json"
            args, pass_fds = ["worker", "--model", entry.name], ()
            if i == 0:
                ready_read, ready_write = os.pipe()
                args, pass_fds = [*args, "--ready-fd", str(ready_write)], (ready_write,)
                ready_reads.append(ready_read)
            env = {"PAGEDQ_WORKER_STATUS_FILE": str(status)}
            children[f"worker {entry.name} {i}"] = _child(settings, *args, pass_fds=pass_fds, env=env)
            for fd in pass_fds:
                os.close(fd)
    return children, ready_reads


def _child(
    settings: Settings, *args: str, pass_fds: tuple[int, ...] = (), env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "pagedq", *args]  # stdout: Celery's notes on shutting down
    environment = env_for(settings) | (env or {})
    return subprocess.Popen(command, env=environment, pass_fds=pass_fds, stdout=subprocess.DEVNULL)


def _announce_when_ready(url: str, ready_reads: list[int], api_stopping: threading.Event) -> None:
    """After each model's first worker's line (it consumes) and a 200 from /readyz, a ready line per model."""
    workers = []
    for ready_read in ready_reads:
        with os.fdopen(ready_read) as announcement:
            line = announcement.readline()
        if not line:  # a worker died first; _stop_when_child_dies reports it
            return
        workers.append(json.loads(line))
    while not api_stopping.wait(0.2):
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            continue
    else:
        return
    for worker in workers:
        logger.info("service ready", extra={"api": url} | worker)
    print(ready_lines(url, workers), flush=True)


def ready_lines(url: str, workers: list[dict[str, Any]]) -> str:
    """A ready line per model, then the README's first request and where to watch it."""
    lines = []
    for worker in workers:
        kv = (
            f", KV cache {worker['kv_cache_bytes'] / 2**30:.2f} GiB ({worker['kv_cache_blocks']} blocks)"
            if "kv_cache_bytes" in worker
            else ""
        )
        where = (
            f"{worker.get('device', '?')} ({worker.get('dtype', '?')}, context {worker.get('max_model_len')})"
        )
        lines.append(
            f"{READY}: API {url}, worker {worker['worker_id']}, model {worker['model']} on {where}"
            f"{kv}{weights_text(worker.get('weights'))}\n"
        )
    return (
        "".join(lines) + "Try:\n"
        f"  curl -s {url}/v1/jobs -H 'Content-Type: application/json' -H 'Prefer: wait=30' \\\n"
        """    -d '{"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 64}'"""
        f"\nand watch it in the console: {url}/console"
    )


def weights_text(weights: dict[str, Any] | None) -> str:
    """The ready line's part on the engine's weights, e.g. ", weights 150 Q4_1 + 61 F32 tensors (88.2 MiB)
    on gguf-float-fma-avx2 kernels"."""
    if not weights:
        return ""
    types = " + ".join(f"{count} {name}" for name, count in weights["types"].items())
    return f", weights {types} tensors ({weights['bytes'] / 2**20:.1f} MiB) on {weights['kernels']} kernels"


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
                    worker = name.startswith("worker")
                    child.send_signal(signal.SIGTERM if sig == signal.SIGUSR2 and not worker else sig)
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
