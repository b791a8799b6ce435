"""The runbook's steps, in order: what each checks, its target, and its time limit."""

from dataclasses import dataclass

from bench.gpu_throughput import TARGETS

TOTAL_BUDGET_S = 25 * 60  # the whole book on an H100
STEP_BUDGET_S = 9 * 60  # a lent machine runs a command for at most 10 minutes


@dataclass(frozen=True)
class Step:
    number: int
    title: str
    entry: str  # "module:function" run in the step's own process
    budget_s: int  # time limit on an H100
    dry_budget_s: int  # time limit of the dry run on a small, busy CPU box
    target: str
    cuda_only: bool = False  # the dry run cannot check its point: it says "needs CUDA"


STEPS = (
    Step(1, "environment", "bench.gpu_check.steps.env:run", 30, 90, "a CUDA GPU that torch sees"),
    Step(
        2,
        "GPU tests and Triton kernels",
        "bench.gpu_check.steps.tests:run",
        240,
        240,
        "every test passes",
        cuda_only=True,
    ),
    Step(
        3,
        "engine parity",
        "bench.gpu_check.steps.parity:run",
        120,
        150,
        "float32 tokens = transformers', logprobs within 1e-3; bf16 prefix reported",
    ),
    Step(
        4,
        "CUDA graphs on vs off",
        "bench.gpu_check.steps.graphs:run",
        120,
        150,
        "same tokens; graphs faster at batch 1",
        cuda_only=True,
    ),
    Step(
        5,
        "KV pool sized by profiling",
        "bench.gpu_check.steps.kv_pool:run",
        150,
        120,
        "no OOM at 256 seats; peak <= 95% of GPU memory",
        cuda_only=True,
    ),
    Step(
        6,
        "8B-shaped throughput",
        "bench.gpu_check.steps.throughput:run",
        480,
        300,
        f"decode@256 <= {TARGETS['decode@256']}x bound, decode@1 <= {TARGETS['decode@1']}x, "
        f"offline >= {TARGETS['offline']}x best static batch",
    ),
    Step(
        7,
        "the service on the GPU",
        "bench.gpu_check.steps.service:run",
        240,
        300,
        "every job and batch line succeeds; /metrics agrees",
    ),
    Step(
        8,
        "embeddings and GGUF",
        "bench.gpu_check.steps.extras:run",
        90,
        90,
        "each path that exists matches its reference",
    ),
)
assert sum(s.budget_s for s in STEPS) <= TOTAL_BUDGET_S and max(s.budget_s for s in STEPS) <= STEP_BUDGET_S


def select(spec: str) -> list[Step]:
    """``all``, or step numbers and ranges: ``1-4``, ``5,7,8``."""
    if spec == "all":
        return list(STEPS)
    wanted: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        wanted.update(range(int(first), int(last or first) + 1))
    by_number = {s.number: s for s in STEPS}
    if unknown := sorted(wanted - set(by_number)):
        raise ValueError(f"no step {unknown}: the steps are 1-{len(STEPS)}")
    return [by_number[n] for n in sorted(wanted)]
