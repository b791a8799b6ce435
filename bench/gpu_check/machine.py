"""Which machine and which code a run measured (the GPU machines get the tree without its .git)."""

import hashlib
import platform
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = ("api", "bench", "contract", "core", "kernels", "migrations", "pagedq", "tests", "worker")


def _run(*command: str) -> str | None:
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpu_name() -> str | None:
    """The first GPU's name and memory, from nvidia-smi; None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    line = _run("nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader")
    return line.splitlines()[0].replace(", ", " ") if line else None


def describe_machine(dry_run: bool) -> str:
    if dry_run:
        return f"CPU {platform.machine()} (dry run: tiny sizes, figures mean nothing)"
    return gpu_name() or "no GPU found"


def describe_code() -> str:
    """``commit abc1234`` (``-dirty`` with uncommitted changes), or a digest of the code where git is not."""
    commit = _run("git", "rev-parse", "--short", "HEAD")
    if commit is None:
        return f"tree sha256:{tree_digest()} (no git here)"
    dirty = _run("git", "status", "--porcelain", "--untracked-files=no")
    return f"commit {commit}{'-dirty' if dirty else ''}"


def tree_digest() -> str:
    """Over the code's Python, C++ and TOML files (pyproject.toml included), in path order."""
    digest = hashlib.sha256()
    code = (
        f
        for d in CODE
        for f in (REPO / d).rglob("*")
        if f.suffix in (".py", ".cpp", ".toml") and f.is_file() and ".llama.cpp" not in f.parts
    )
    for f in [REPO / "pyproject.toml", *sorted(code)]:
        digest.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:12]
