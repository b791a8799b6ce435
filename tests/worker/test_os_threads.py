"""The worker's threads carry their names to the OS, and bookkeeping threads a nice increment the engine
thread and the heartbeat do not get."""

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker import os_threads

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="thread names and nice are Linux's")


@pytest.fixture
def nice_five() -> Iterator[None]:
    os_threads.set_bookkeeping_nice(5)
    yield
    os_threads.set_bookkeeping_nice(0)


def named_thread(name: str, bookkeeping: bool) -> tuple[str, int]:
    """The OS name and nice of a new thread that names itself."""
    seen: list[tuple[str, int]] = []

    def run() -> None:
        os_threads.name_this_thread(name, bookkeeping)
        tid = threading.get_native_id()
        comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        seen.append((comm, os.getpriority(os.PRIO_PROCESS, tid)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0]


def test_bookkeeping_threads_are_named_and_yield_to_the_engine(nice_five: None) -> None:
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert named_thread("pagedq-flusher", bookkeeping=True) == ("pagedq-flusher", min(base + 5, 19))
    assert named_thread("pagedq-engine-and-more", bookkeeping=False) == ("pagedq-engine-a", base)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the caller's is untouched


def test_without_the_setting_no_thread_is_niced() -> None:
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert named_thread("pagedq-seat", bookkeeping=True) == ("pagedq-seat", base)
