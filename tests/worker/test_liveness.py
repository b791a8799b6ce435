"""worker/liveness.py on this Linux host's /proc: a process is proven dead only when it ran in this boot and
PID namespace and is gone (exited, a zombie, or its pid now another process's); from anywhere else nothing
is proven."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.services import wait_for
from worker.liveness import proven_dead, this_process

PRINT_AND_WAIT = "from worker.liveness import this_process; print(this_process(), flush=True); input()"


@pytest.fixture
def child() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A live Python process and what it says it is."""
    process = subprocess.Popen(
        [sys.executable, "-c", PRINT_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    yield process, process.stdout.readline().strip()
    process.kill()
    process.wait()


def test_a_live_process_is_not_proven_dead(child):
    process, identity = child
    assert identity.split("/")[2] == str(process.pid)
    assert not proven_dead(identity)
    assert not proven_dead(this_process() or "")
    boot, namespace, pid, start = identity.split("/")
    assert proven_dead(f"{boot}/{namespace}/{pid}/{int(start) - 1}"), "its pid is now another process's"


def test_a_killed_process_is_proven_dead_as_a_zombie_and_once_reaped(child):
    process, identity = child
    process.kill()
    wait_for(lambda: proven_dead(identity), 10, "the kill to land")
    assert Path(f"/proc/{process.pid}").exists(), "not reaped yet: a zombie is dead too"
    process.wait()
    assert proven_dead(identity)


def test_nothing_is_proven_of_another_boot_or_namespace_or_of_garbage(child):
    process, identity = child
    process.kill()
    process.wait()
    boot, namespace, pid, start = identity.split("/")
    assert not proven_dead(f"00000000-0000-0000-0000-000000000000/{namespace}/{pid}/{start}")
    assert not proven_dead(f"{boot}/1/{pid}/{start}")
    assert not proven_dead("not an identity")
