"""Step 2: the tests marked ``gpu`` (the Triton kernels at real sizes against their torch references:
paged attention over mixed prefill + decode batches with GQA, split-K decodes, write-KV, RMSNorm, SiLU*mul;
CUDA graphs), and the rest of tests/kernels/test_kernels_triton.py compiled for the GPU.

Dry run: the ``gpu`` tests are collected and skip, and a few kernel tests run under ``TRITON_INTERPRET=1``.
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.gpu_check.outcome import FAIL, NEEDS_CUDA, PASS, Context, Outcome

REPO = Path(__file__).resolve().parents[3]
KERNELS = "tests/kernels/test_kernels_triton.py"
# Under the interpreter: GQA attention over a mixed batch, write-KV, RMSNorm, SiLU*mul, the whole model.
INTERPRETED = "dtype0-64-4-16 or write_kv or rms_norm or silu or engine_through"
GPU_MARK = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\b.*\bpytest\.mark\.gpu\b)", re.MULTILINE)


@dataclass
class Session:
    """One pytest run: its exit code, counts by outcome, and the failing tests' lines."""

    what: str
    code: int
    counts: dict[str, int]
    failures: list[str]

    def summary(self) -> str:
        counts = ", ".join(f"{n} {word}" for word, n in self.counts.items()) or "nothing ran"
        return f"{self.what}: {counts}"

    @property
    def clean(self) -> bool:
        return self.code == 0 and self.counts.get("passed", 0) > 0


def gpu_test_files() -> list[str]:
    """The test modules that hold ``gpu``-marked tests (other modules may not import without a database)."""
    files = sorted((REPO / "tests").rglob("test_*.py"))
    return [str(f.relative_to(REPO)) for f in files if GPU_MARK.search(f.read_text())]


def pytest(what: str, args: list[str], ctx: Context, interpret: bool) -> Session:
    env = dict(os.environ, **({"TRITON_INTERPRET": "1"} if interpret else {}))
    command = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *args]
    print("$", " ".join(command), flush=True)
    timeout = max(ctx.seconds_left() - 10, 10)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    print(done.stdout[-20000:], done.stderr[-5000:], sep="\n", flush=True)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {
        word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", last)
    }
    failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return Session(what, done.returncode, counts, failures)


def run(ctx: Context) -> Outcome:
    if not gpu_test_files():
        return Outcome(FAIL, "no test module holds a gpu-marked test", "")
    gpu = pytest("gpu-marked tests", ["-m", "gpu", *gpu_test_files()], ctx, interpret=ctx.dry_run)
    ctx.report(Outcome(FAIL, gpu.summary(), _details([gpu])))
    if ctx.dry_run:
        kernels = pytest("kernels (interpreted)", [KERNELS, "-m", "not gpu", "-k", INTERPRETED], ctx, True)
        ran_none = gpu.counts.get("passed", 0) == 0 and gpu.counts.get("skipped", 0) > 0
        result = NEEDS_CUDA if kernels.clean and ran_none else FAIL
    else:
        kernels = pytest("kernels (compiled)", [KERNELS, "-m", "not gpu"], ctx, False)
        result = PASS if gpu.clean and kernels.clean else FAIL
    return Outcome(result, f"{gpu.summary()}; {kernels.summary()}", _details([gpu, kernels]))


def _details(sessions: list[Session]) -> str:
    lines = []
    for s in sessions:
        lines.append(f"- {s.summary()} (exit {s.code})")
        lines += [f"  - `{failure}`" for failure in s.failures[:40]]
    return "\n".join(lines)
