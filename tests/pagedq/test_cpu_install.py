"""A CPU install has no triton (it is the ``gpu`` extra): every product module imports and the engine runs
without it, CUDA tensors fall back to the torch reference, and asking for Triton says what to install."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# ``None`` in sys.modules makes ``import triton`` fail and ``importlib.util.find_spec("triton")`` answer
# None, as when it is not installed (transformers asks the latter).
WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None

import importlib, os, pkgutil
import torch

NOT_MODULES = ("pagedq.__main__", "migrations.env", "migrations.versions.")  # scripts, run by others
GPU_ONLY = ("kernels.triton_",)
imported = []
for package in ("pagedq", "contract", "core", "api", "worker", "kernels", "migrations"):
    imported.append(package)
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if not info.name.startswith(NOT_MODULES + GPU_ONLY):
            imported.append(importlib.import_module(info.name).__name__)

from kernels import dispatch
from worker.engine import LLM, SamplingParams

llm = LLM(sys.argv[1], device="cpu", kv_cache_bytes=4 << 20)
[out] = llm.generate(["The quick brown fox"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
assert len(out.outputs[0].token_ids) == 4, out
assert dispatch.backend_for(torch.device("cuda")) == "torch"
os.environ["PAGEDQ_KERNEL_BACKEND"] = "triton"
try:
    dispatch.backend_for(torch.device("cpu"))
except RuntimeError as error:
    print("refused:", error)
print("imported", len(imported), "modules", *imported)
"""


def test_a_cpu_install_imports_and_runs_without_triton(tiny_llama: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRITON, str(tiny_llama)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    count, _, *imported = done.stdout.split("imported ", 1)[1].split()
    assert int(count) == len(imported) > 50 and {"core.settings", "worker.engine.llm"} <= set(imported)
    assert {"api", "kernels", "migrations", "pagedq"} <= {name.split(".")[0] for name in imported}
    assert "refused: PAGEDQ_KERNEL_BACKEND=triton needs triton" in done.stdout, done.stdout[-2000:]
    assert "pip install 'pagedq[gpu]'" in done.stdout
    assert "triton is not installed" in done.stderr  # the one warning, for the CUDA device's fallback
