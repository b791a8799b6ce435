"""What a step reports, and how its process hands that to the runner (a JSON file, rewritten as it goes)."""

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PASS, MISS, FAIL = "pass", "miss", "fail"  # miss: it ran correctly, but short of its target
NEEDS_CUDA = "needs CUDA"  # dry run: the step ran on the CPU, but what it checks needs a GPU
RAN = "ran (dry run)"  # dry run: the step's code ran at tiny sizes; its figures mean nothing
TIMED_OUT, RUNNING, NOT_RUN = "timed out", "running", "not run"
SKIPPED = "skipped"  # "skipped: why"


@dataclass
class Outcome:
    result: str
    figure: str = ""  # one line for the summary table
    details: str = ""  # markdown for the step's section

    @property
    def failed(self) -> bool:
        return self.result in (FAIL, TIMED_OUT)


@dataclass
class Context:
    """What a step's process knows: the mode, a scratch folder, its deadline, where its outcome goes."""

    dry_run: bool
    workdir: Path
    outcome_file: Path
    deadline: float  # time.time() by which the step must have reported

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def seconds_left(self) -> float:
        return self.deadline - time.time()

    def report(self, outcome: Outcome) -> None:
        """Rewrite the outcome so far: the runner keeps it if the step is then cut off."""
        partial = self.outcome_file.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(outcome)))
        os.replace(partial, self.outcome_file)


def read_outcome(path: Path) -> Outcome | None:
    try:
        return Outcome(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
