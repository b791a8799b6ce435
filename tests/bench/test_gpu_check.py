"""The GPU runbook (``python -m bench.gpu_check``) keeps running on machines without a GPU: its dry run does
every step at tiny sizes on the CPU, and the runner records steps that fail, die or overrun and goes on."""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_wheels
from bench.gpu_check import results
from bench.gpu_check.__main__ import run_one
from bench.gpu_check.outcome import FAIL, NEEDS_CUDA, PASS, RAN, RUNNING, SKIPPED, TIMED_OUT, Outcome
from bench.gpu_check.plan import STEPS, Step, select
from bench.gpu_check.runner import run_step

REPO = Path(__file__).resolve().parents[2]


def summary_rows(text: str) -> dict[str, list[str]]:
    table = text.rsplit(results.SUMMARY, 1)[1]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.splitlines()
        if line[:1] == "|"
    ]
    return {cells[0]: cells[1:] for cells in rows}


@pytest.mark.timeout(1600)
def test_the_dry_run_runs_every_step_and_says_which_need_cuda(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS-gpu.md"
    command = [
        sys.executable,
        "-m",
        "bench.gpu_check",
        "--dry-run",
        "--out",
        str(out),
        "--copy-to",
        str(tmp_path / "c"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1500)
    log = tmp_path / "gpu-check.log"
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}\n{log.read_text()[-6000:]}"
    text = out.read_text()
    rows = summary_rows(text)
    for step in STEPS:
        result, figure, target, time_taken = rows[f"{step.number}. {step.title}"]
        assert step.target == target and time_taken, step
        if step.cuda_only:
            assert result == NEEDS_CUDA, (step, result, figure)
        else:
            assert result in (PASS, RAN) or result.startswith(SKIPPED), (step, result, figure)
        assert f"### {step.number}. {step.title}: {result}" in text
        assert f"| {step.number}. {step.title} | {result} |" in done.stdout  # the summary is printed too
    assert "dependencies: every runtime dependency was installed already" in text
    assert (tmp_path / "c" / out.name).read_text() == text and (tmp_path / "c" / "gpu-check.log").is_file()


def fake(entry: str, limit: int) -> Step:
    return Step(99, "fake", f"tests.support.gpu_check_fakes:{entry}", limit, limit, "-")


def test_a_step_past_its_limit_is_cut_off_and_keeps_what_it_reported(tmp_path: Path) -> None:
    start, reported = time.monotonic(), []
    outcome, seconds = run_step(
        fake("slow", 3), dry_run=True, log=tmp_path / "log", on_report=reported.append
    )
    assert [r.figure for r in reported] == ["measured before the cut"]  # handed on while the step ran
    assert outcome.result == TIMED_OUT and outcome.figure == "measured before the cut"
    assert "half the work" in outcome.details and "Cut off at its limit of 3 s" in outcome.details
    assert 3 <= seconds < 30 and time.monotonic() - start < 30


def test_within_cuts_a_step_to_the_time_left_and_skips_one_that_cannot_start(tmp_path: Path) -> None:
    args = argparse.Namespace(dry_run=True, log=tmp_path / "log", within=100)
    run, saved = results.Run("2026-11-30 15:00 UTC", "CPU", "commit aaa", True), []
    save = lambda: saved.append(run.steps[99])  # noqa: E731
    run_one(fake("deadline", 600), args, run, save, left_s=40)
    assert saved[0].result == RUNNING and saved[0].limit_s == 40
    assert saved[-1].result == PASS and 30 <= int(saved[-1].figure) <= 40  # the step's own deadline

    run_one(fake("deadline", 600), args, run, save, left_s=12)
    assert saved[-1].result == SKIPPED and saved[-1].figure == "no time: 12 s left of --within 100"


def test_a_step_that_raises_or_dies_is_a_failure_with_its_reason(tmp_path: Path) -> None:
    raised, _ = run_step(fake("raises", 60), dry_run=True, log=tmp_path / "log")
    assert raised.result == FAIL and raised.figure == "RuntimeError: the second part broke"
    assert "the first part ran" in raised.details and "Traceback" in raised.details
    died, _ = run_step(fake("dies", 60), dry_run=True, log=tmp_path / "log")
    assert died.result == FAIL and died.figure == "its process exited with 3"
    assert "===== step 99: fake" in (tmp_path / "log").read_text()


def test_continue_adds_steps_to_the_last_run_and_keeps_earlier_runs(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS-gpu.md"
    results.write(path, results.empty_file())
    head, run = results.load(path)
    assert run is None and results.NO_RUN in head
    first = results.Run("2026-11-30 15:00 UTC", "GPU A", "commit aaa", False, ["15:00 `--steps all`"])
    first.steps[1] = results.StepRecord(1, PASS, "GPU A, 80 GiB", 3.0, 30, "| what | value |")
    results.write(path, results.render(head, first))
    earlier = path.read_text()

    second = results.Run("2026-11-30 16:00 UTC", "GPU B", "commit bbb", False, ["16:00 `--steps 1-4`"])
    second.steps[4] = results.StepRecord(
        4, "miss", "graphs 0.9x", 61.0, 120, "Tokens identical.\n\n| a | b |"
    )
    results.write(path, results.render(earlier, second))
    head, loaded = results.load(path)
    assert head.rstrip() == earlier.rstrip() and results.NO_RUN not in path.read_text()
    assert loaded == second

    loaded.steps[2] = results.StepRecord(2, FAIL, "1 failed", 200.0, 240, "- `FAILED tests/x.py::y`")
    loaded.invocations.append("16:10 `--steps 2 --continue`")
    results.write(path, results.render(head, loaded))
    text = path.read_text()
    assert text.startswith(earlier.rstrip()) and text.count(results.RUN_MARK) == 2
    rows = summary_rows(text)
    assert rows["2. GPU tests and Triton kernels"][:2] == [FAIL, "1 failed"]
    assert (
        rows["4. CUDA graphs on vs off"][0] == "miss"
        and rows["5. KV pool sized by profiling"][0] == "not run"
    )
    assert text.index("### 2.") < text.index("### 4.")  # step order, whatever order they ran in
    assert results.load(path)[1] == loaded


def test_steps_are_chosen_by_number_and_fit_their_budgets() -> None:
    assert [s.number for s in select("5,7-8")] == [5, 7, 8] and select("all") == list(STEPS)
    with pytest.raises(ValueError, match="no step"):
        select("9")
    assert sum(s.budget_s for s in STEPS) <= 25 * 60 and all(s.budget_s <= 9 * 60 for s in STEPS)
    # The device runbook's three commands each fit a 10-minute command with a minute to spare.
    for group in ("1-4", "5,7,8", "6"):
        assert sum(s.budget_s for s in select(group)) <= 9 * 60, group


def test_the_gpu_wheels_are_the_dependencies_the_image_lacks() -> None:
    wanted = gpu_wheels.requirements()
    names = {gpu_wheels.requirement_name(r) for r in wanted}
    assert {"fastapi", "pydantic", "sqlalchemy", "celery", "redis", "psycopg", "llguidance", "gguf"} <= names
    assert not names & gpu_wheels.ON_IMAGE and not any(gpu_wheels.NEVER.match(n) for n in names)
    assert gpu_wheels.unsatisfied(wanted) == []  # this environment runs the tests: it has them all
    assert gpu_wheels.unsatisfied(["fastapi>=999", "no-such-package-here"]) == [
        "fastapi>=999",
        "no-such-package-here",
    ]
    assert Outcome(TIMED_OUT).failed and not Outcome(NEEDS_CUDA).failed


def test_step_2_runs_the_modules_that_hold_gpu_tests_wherever_they_live() -> None:
    from bench.gpu_check.steps.tests import gpu_test_files

    # the kernel tests alone mark tests `gpu`; this module names the mark but marks nothing
    assert gpu_test_files() == ["tests/kernels/test_kernels_triton.py"]


def test_step_7_serves_the_chat_model_alone_whatever_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.gpu_check.outcome import Context
    from bench.gpu_check.steps.service import up_env

    monkeypatch.delenv("PAGEDQ_EMBED_MODEL", raising=False)
    monkeypatch.setenv("PAGEDQ_MODELS", '[{"name": "x", "source": "y"}]')
    ctx = Context(False, tmp_path, tmp_path / "outcome.json", time.time() + 60)
    env = up_env(tmp_path / "model", ctx, 8000)
    assert env["PAGEDQ_EMBED_MODEL"] == "" and "PAGEDQ_MODELS" not in env
    assert env["PAGEDQ_MODEL"] == str(tmp_path / "model") and env["PAGEDQ_DEVICE"] == "cuda"
