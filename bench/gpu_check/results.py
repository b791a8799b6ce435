"""bench/RESULTS-gpu.md: one section per run, newest last, rewritten whole after every step.

A run's section is its heading, one block per step (in step order, whatever order they ran in) and a
summary table. Each heading and block starts with an HTML comment holding its fields as JSON, so that
``--continue`` can read the last run back and add steps to it; the blocks' text is kept as written.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.gpu_check.outcome import NOT_RUN
from bench.gpu_check.plan import STEPS

PREAMBLE = """# GPU check results

Written by `python -m bench.gpu_check` (`make gpu-check`; README, "On a GPU"): each run adds a section,
the newest last. A step ran in its own process under the time limit shown; its time includes building
its models. A step still marked "running" was cut off there. Results: pass; miss (ran, short of its
target); fail; timed out; needs CUDA and ran (dry run) only in dry runs.
"""
NO_RUN = "_No run recorded yet._\n"
RUN_MARK, STEP_MARK, END = "<!-- gpu-check run ", "<!-- gpu-check step ", " -->"
SUMMARY = "### Summary"


@dataclass
class StepRecord:
    number: int
    result: str
    figure: str
    seconds: float | None
    limit_s: int
    details: str = ""


@dataclass
class Run:
    started: str  # "2026-11-30 15:40 UTC"
    machine: str
    code: str
    dry_run: bool
    invocations: list[str] = field(default_factory=list)  # one line per command that added to this run
    steps: dict[int, StepRecord] = field(default_factory=dict)


def load(path: Path) -> tuple[str, Run | None]:
    """The file's text before its last run, and that run (None, and the whole text, if it has none)."""
    text = path.read_text() if path.exists() else ""
    start = text.rfind(RUN_MARK)
    if start < 0:
        return text, None
    head, section = text[:start], text[start:]
    meta, _, rest = section[len(RUN_MARK) :].partition(END)
    run = Run(**json.loads(meta))
    for block in rest.split(STEP_MARK)[1:]:
        fields, _, body = block.partition(END)
        body = body.split(f"\n{SUMMARY}\n", 1)[0]
        details = body.strip("\n").partition("\n")[2].strip("\n")  # the line after the mark is the heading
        record = StepRecord(**json.loads(fields), details=details)
        run.steps[record.number] = record
    return head, run


def render(head: str, run: Run) -> str:
    """The whole file: what came before, then this run."""
    head = head.replace(NO_RUN, "").rstrip("\n") or PREAMBLE.rstrip("\n")
    meta = asdict(run)
    meta.pop("steps")
    lines = [
        head,
        "",
        f"{RUN_MARK}{json.dumps(meta)}{END}",
        f"## {run.started}: {run.machine}, {run.code}",
        "",
    ]
    lines += [f"- {line}" for line in run.invocations] + [""]
    for number in sorted(run.steps):
        lines += _block(run.steps[number])
    return "\n".join([*lines, SUMMARY, "", *summary_table(run), ""])


def _block(record: StepRecord) -> list[str]:
    step = STEPS[record.number - 1]
    fields = asdict(record)
    fields.pop("details")
    heading = f"### {step.number}. {step.title}: {record.result} ({duration(record.seconds)})"
    return [f"{STEP_MARK}{json.dumps(fields)}{END}", heading, "", record.details.strip("\n") or "-", ""]


def summary_table(run: Run) -> list[str]:
    rows = ["| step | result | figure | target | time (limit) |", "| --- | --- | --- | --- | ---: |"]
    for step in STEPS:
        record = run.steps.get(step.number)
        if record is None:
            rows.append(f"| {step.number}. {step.title} | {NOT_RUN} | | {step.target} | |")
            continue
        time = f"{duration(record.seconds)} ({duration(record.limit_s)})"
        cells = [f"{step.number}. {step.title}", record.result, _cell(record.figure), step.target, time]
        rows.append(f"| {' | '.join(cells)} |")
    total = sum(r.seconds or 0 for r in run.steps.values())
    return [*rows, f"| all | | | | {duration(total)} |"]


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds // 60:.0f} min {seconds % 60:.0f} s"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


def empty_file() -> str:
    return f"{PREAMBLE}\n{NO_RUN}"
