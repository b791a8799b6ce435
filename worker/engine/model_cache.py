"""Where the built-in models are built (``$PAGEDQ_CACHE_DIR``), and the lock and clean-up every build of
one into it shares (the chat model's in default_model.py, the embedding model's in minilm.py)."""

import fcntl
import logging
import os
import shutil
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


def remove_leftovers(target: Path) -> None:
    """Drop an incomplete model directory and scratch directories of builds that crashed (lock held)."""
    for stale in [target, *target.parent.glob(f".{target.name}.build-*")]:
        if stale.exists():
            logger.warning("removing incomplete build %s", stale)
            shutil.rmtree(stale)
