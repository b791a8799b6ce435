"""Step 1: the machine and the software: GPU, memory, driver, CUDA, torch, triton, pagedq's code."""

import importlib.metadata
import platform
import re
import subprocess

from bench.gpu_check import machine
from bench.gpu_check.outcome import FAIL, PASS, RAN, Context, Outcome

PACKAGES = ("torch", "triton", "transformers", "tokenizers", "fastapi", "pydantic", "sqlalchemy", "celery")


def run(ctx: Context) -> Outcome:
    import torch

    rows = [("code", machine.describe_code()), ("tree digest", machine.tree_digest())]
    rows += [("python", platform.python_version()), ("CUDA (torch's build)", str(torch.version.cuda))]
    rows += [(name, _version(name)) for name in PACKAGES]
    if not torch.cuda.is_available():
        rows.append(("GPU", "none that torch sees"))
        return Outcome(RAN if ctx.dry_run else FAIL, f"no GPU; torch {torch.__version__}", _table(rows))
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    smi = _nvidia_smi()
    capability = f"{props.major}.{props.minor}"
    rows += [
        ("GPU", f"{props.name}, compute capability {capability}, {props.multi_processor_count} SMs"),
        ("GPU memory", f"{total / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"),
        ("driver (nvidia-smi)", smi),
    ]
    figure = f"{props.name}, {total / 2**30:.0f} GiB, {smi}, torch {torch.__version__}"
    return Outcome(PASS, figure, _table(rows))


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_smi() -> str:
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return f"driver {done.stdout.strip() or '?'}, CUDA {cuda[1] if cuda else '?'} (the driver's)"


def _table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| what | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)])
