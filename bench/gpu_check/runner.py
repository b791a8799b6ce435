"""Runs one step in a process of its own under its time limit, and the dependency install before them."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import gpu_wheels
from bench.gpu_check.outcome import FAIL, TIMED_OUT, Outcome, read_outcome
from bench.gpu_check.plan import Step

REPO = Path(__file__).resolve().parents[2]
KILL_GRACE_S = 15
REPORT_POLL_S = 2
LOG_TAIL_LINES = 40


def step_env(dry_run: bool) -> dict[str, str]:
    """The steps' environment: this tree's code first, nothing fetched from a hub, output unbuffered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.pop("PAGEDQ_KERNEL_BACKEND", None)  # each step picks its kernels as the engine's default does
    if dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU's, even on a GPU machine
    return env


def run_step(
    step: Step,
    dry_run: bool,
    log: Path,
    limit: float | None = None,
    on_report: Callable[[Outcome], None] | None = None,
) -> tuple[Outcome, float]:
    """The step's outcome and its wall time. Past ``limit`` (default: the step's own) the step's whole
    process group is killed; what it reported so far is kept, marked timed out. ``on_report`` gets each
    outcome the step reports while it runs, so that a command killed from outside still leaves it."""
    limit = limit or (step.dry_budget_s if dry_run else step.budget_s)
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{step.number}-") as tmp:
        outcome_file = Path(tmp) / "outcome.json"
        command = [sys.executable, "-m", "bench.gpu_check", "--child", step.entry, "--workdir", tmp]
        command += ["--outcome", str(outcome_file), "--deadline", str(time.time() + limit)]
        command += ["--dry-run"] * dry_run
        with log.open("a") as out:
            out.write(f"\n===== step {step.number}: {step.title} ({time.strftime('%H:%M:%S')}) =====\n")
            out.flush()
            start = time.monotonic()
            process = subprocess.Popen(
                command,
                cwd=REPO,
                env=step_env(dry_run),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            code = _wait(process, limit, outcome_file, on_report or (lambda _: None))
            seconds = time.monotonic() - start
        outcome = read_outcome(outcome_file)
    if code is None:
        outcome = outcome or Outcome(TIMED_OUT)
        note = f"Cut off at its limit of {limit:.0f} s; the figures above are what it had measured by then."
        return Outcome(TIMED_OUT, outcome.figure, f"{outcome.details}\n\n{note}".strip()), seconds
    if outcome is None or (code != 0 and not outcome.failed):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:])
        why = f"its process exited with {code}" + ("" if outcome is None else " after reporting")
        return Outcome(FAIL, why, f"The log's last lines:\n\n```\n{tail}\n```"), seconds
    return outcome, seconds


def _wait(
    process: subprocess.Popen[bytes], limit: float, outcome_file: Path, on_report: Callable[[Outcome], None]
) -> int | None:
    """The exit code, or None when the limit passed (the process group is then killed). Meanwhile each
    outcome the step reports goes to ``on_report``."""
    deadline, reported = time.monotonic() + limit, 0
    while (left := deadline - time.monotonic()) > 0:
        try:
            return process.wait(min(REPORT_POLL_S, left))
        except subprocess.TimeoutExpired:
            pass
        changed = outcome_file.stat().st_mtime_ns if outcome_file.exists() else 0
        if changed != reported and (outcome := read_outcome(outcome_file)) is not None:
            reported = changed
            on_report(outcome)
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return None


def install_dependencies(wheels: Path, dry_run: bool, log: Path) -> str:
    """Installs the runtime dependencies this interpreter lacks from ``wheels`` (``make gpu-wheels``),
    never from a network, and says what it did (pip's output goes to ``log``). The dry run installs
    nothing. A failed install stops nothing: the steps that need the packages fail and say why."""
    missing = gpu_wheels.unsatisfied(gpu_wheels.requirements())
    if not missing:
        return "dependencies: every runtime dependency was installed already"
    names = ", ".join(gpu_wheels.requirement_name(r) for r in missing)
    if dry_run or not wheels.is_dir():
        where = f"from {wheels}" if wheels.is_dir() else f"but there is no {wheels} (`make gpu-wheels`)"
        return f"dependencies: missing {names}; not installed {where}"
    done = gpu_wheels.install(wheels, missing)
    with log.open("a") as out:
        out.write(f"\n===== pip install from {wheels} =====\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        return (
            f"dependencies: pip could not install {names} from {wheels} (exit {done.returncode}; see the log)"
        )
    return f"dependencies: installed {names} (and what they need) from {wheels}"
