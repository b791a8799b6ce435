"""``python -m bench.gpu_check``: the runbook (this package's docstring), or one step in this process."""

import argparse
import importlib
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import bench.gpu_check
from bench import gpu_wheels
from bench.gpu_check import machine, plan, results, runner
from bench.gpu_check.outcome import FAIL, RUNNING, SKIPPED, Context, Outcome, read_outcome
from bench.gpu_check.results import Run, StepRecord

REPO = Path(__file__).resolve().parents[2]
LOG_COPY_BYTES = 15 << 20  # a lent machine hands back files of at most 16 MiB
CLOSE_S = 20  # of --within, kept for the last step's kill grace and the final save
MIN_STEP_S = 30  # a step is not started with less time than this left of --within


def main() -> int:
    args = parse_args()
    if args.child:
        return child(args)
    steps = plan.select(args.steps)
    if not args.dry_run and machine.gpu_name() is None:
        print("no NVIDIA GPU here (nvidia-smi finds none); --dry-run runs on the CPU", file=sys.stderr)
        return 2
    log = args.log = args.log or args.out.with_name("gpu-check.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"\n===== python -m bench.gpu_check {' '.join(sys.argv[1:])} at {time.ctime()} =====\n")
    head, run = results.load(args.out)
    if not (args.resume and run is not None and run.dry_run == args.dry_run):
        head = args.out.read_text() if args.out.exists() else results.empty_file()
        code, started = machine.describe_code(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        run = Run(started, machine.describe_machine(args.dry_run), code, args.dry_run)
    deps = runner.install_dependencies(args.wheels, args.dry_run, log)
    run.invocations.append(f"{time.strftime('%H:%M', time.gmtime())} UTC, `--steps {args.steps}`; {deps}")

    def save() -> None:
        results.write(args.out, results.render(head, run))
        if args.copy_to:
            copy(args.out, log, args.copy_to)

    until = time.monotonic() + (args.within or 24 * 3600)
    for step in steps:
        run_one(step, args, run, save, int(until - time.monotonic() - CLOSE_S))
    print("\n".join(["", *results.summary_table(run), "", f"written to {args.out}, log {log}"]))
    return 1 if any(Outcome(run.steps[s.number].result).failed for s in steps) else 0


def run_one(
    step: plan.Step, args: argparse.Namespace, run: Run, save: Callable[[], None], left_s: int
) -> None:
    """Runs ``step`` under its limit or the ``left_s`` seconds left of ``--within``, saving as it goes."""
    limit = min(step.dry_budget_s if args.dry_run else step.budget_s, left_s)
    if limit < MIN_STEP_S:
        why = f"no time: {max(0, left_s)} s left of --within {args.within:.0f}"
        run.steps[step.number] = StepRecord(step.number, SKIPPED, why, None, 0, "")
        save()
        print(f"{step.number}. {step.title}: {SKIPPED} ({why})", flush=True)
        return
    started = f"Started at {time.strftime('%H:%M:%S', time.gmtime())} UTC; if this stays, it was cut off."
    run.steps[step.number] = StepRecord(step.number, RUNNING, "", None, limit, started)
    save()

    def partial(outcome: Outcome) -> None:
        details = f"{outcome.details}\n\n{started}"
        run.steps[step.number] = StepRecord(step.number, RUNNING, outcome.figure, None, limit, details)
        save()

    outcome, seconds = runner.run_step(step, args.dry_run, args.log, limit, partial)
    seconds = round(seconds, 1)
    run.steps[step.number] = StepRecord(
        step.number, outcome.result, outcome.figure, seconds, limit, outcome.details
    )
    save()
    print(
        f"{step.number}. {step.title}: {outcome.result} ({results.duration(seconds)}) {outcome.figure}",
        flush=True,
    )


def copy(out: Path, log: Path, folder: Path) -> None:
    """The results file and the log (its last 15 MiB) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(out, folder / out.name)
    with log.open("rb") as source:
        source.seek(max(0, log.stat().st_size - LOG_COPY_BYTES))
        (folder / log.name).write_bytes(source.read())


def child(args: argparse.Namespace) -> int:
    """Runs one step's ``module:function`` here and writes its outcome, a failure's traceback included."""
    ctx = Context(args.dry_run, Path(args.workdir), Path(args.outcome), args.deadline)
    module, _, function = args.child.partition(":")
    try:
        outcome = getattr(importlib.import_module(module), function)(ctx)
    except Exception as error:
        traceback.print_exc()
        before = read_outcome(ctx.outcome_file)
        details = (f"{before.details}\n\n" if before else "") + f"```\n{traceback.format_exc()}```"
        outcome = Outcome(FAIL, f"{type(error).__name__}: {str(error)[:200]}", details)
    ctx.report(outcome)
    return 0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.gpu_check",
        description=bench.gpu_check.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--steps", default="all", help="which steps: all (default), or e.g. 1-4 or 5,7,8")
    p.add_argument("--continue", dest="resume", action="store_true", help="add to the file's last run")
    p.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: the runbook still runs")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS-gpu.md", help="the results file")
    p.add_argument("--log", type=Path, help="every step's output (default: gpu-check.log beside --out)")
    p.add_argument("--copy-to", type=Path, help="a folder that gets the results and the log after each step")
    p.add_argument(
        "--within",
        type=float,
        help="seconds this command may run (a lent machine's limit per command): each step's limit is cut "
        "to what is left, a step that cannot start is marked skipped, and what a step reports is saved "
        "as it comes",
    )
    p.add_argument("--wheels", type=Path, default=gpu_wheels.WHEELS, help="where `make gpu-wheels` put them")
    # Internal: run one step ("module:function") in this process.
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--outcome", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(main())
