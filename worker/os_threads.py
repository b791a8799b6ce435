"""The worker's threads as the operating system sees them: a name (Linux's ``comm``, 15 bytes), so
``top -H``, ``py-spy`` and bench/service_cpu.py tell them apart (Python 3.11 names them only for
itself), and for bookkeeping threads a nice increment (``PAGEDQ_BOOKKEEPING_NICE``), so that on a busy
CPU they wait for the engine's threads rather than preempt them (Linux's nice is per thread).

Threads a thread starts inherit both: the engine thread's OpenMP team is ``pagedq-engine`` too.
"""

import ctypes
import ctypes.util
import os
import sys
import threading

PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
_bookkeeping_nice = 0


def set_bookkeeping_nice(increment: int) -> None:
    """The nice increment of the threads named as bookkeeping from now on (the worker's setting)."""
    global _bookkeeping_nice
    _bookkeeping_nice = increment


def name_this_thread(name: str, bookkeeping: bool = True) -> None:
    if _libc is None:
        return
    _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    if bookkeeping and _bookkeeping_nice:
        nice = min(os.getpriority(os.PRIO_PROCESS, os.getpid()) + _bookkeeping_nice, 19)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
