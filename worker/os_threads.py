"""Names a thread in the operating system (Linux's ``comm``, 15 bytes), so ``top -H``, ``py-spy`` and
bench/service_cpu.py can tell the worker's threads apart; Python 3.11 names them only for itself.

Threads a named thread starts inherit its name: the engine thread's OpenMP team is ``pagedq-engine`` too.
"""

import ctypes
import ctypes.util
import sys

PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def name_this_thread(name: str) -> None:
    if _libc is not None:
        _libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
