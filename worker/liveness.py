"""Proof that a worker on this host is dead, so its jobs are requeued at once, not a heartbeat timeout later.

A worker records which process it is (``this_process``): the kernel's boot id, its PID namespace, its pid
and that process's start time (a later process may get the same pid). A reconciler in the same boot and PID
namespace can tell for certain whether that process still exists; anywhere else (another host, another
container) only the heartbeat decides, as before. A kill -9, an OOM kill or a crash of a worker beside a
live one, or a worker restarted in place (``pagedq up``, a container's restart policy, systemd), then costs
no heartbeat timeout.
"""

import os
import secrets
import socket
from pathlib import Path

PROC = Path("/proc")


def new_worker_id() -> str:
    """``host:nonce:pid``, different for every worker process: a container restarted in place often gets
    the same host name and pid again, and a worker under its dead predecessor's id would heartbeat for the
    dead one's running jobs, which then never went back to the queue."""
    return f"{socket.gethostname()}:{secrets.token_hex(2)}:{os.getpid()}"


def this_process() -> str | None:
    """``boot/namespace/pid/start``, or None where /proc cannot prove anything (not Linux, or a /proc
    mounted from another PID namespace)."""
    here = _here()
    start = _start_time(os.getpid())
    if here is None or start is None or os.readlink(PROC / "self") != str(os.getpid()):
        return None
    return f"{here}/{os.getpid()}/{start}"


def proven_dead(process: str) -> bool:
    """True only when ``process`` (``this_process`` of some worker) ran in this boot and PID namespace and
    no longer runs: its pid is gone, a zombie, or now another process's."""
    parts = process.split("/")
    if len(parts) != 4 or "/".join(parts[:2]) != _here():
        return False
    return _start_time(int(parts[2])) != parts[3]


def _here() -> str | None:
    try:
        boot = (PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(PROC / "self/ns/pid")  # pid:[4026531836]
    except OSError:
        return None
    return f"{boot}/{namespace.removeprefix('pid:[').removesuffix(']')}"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot; None when no live process has this pid."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces and ')'
    state, start = fields[0], fields[19]  # stat's fields 3 and 22
    return None if state in ("Z", "X") else start
