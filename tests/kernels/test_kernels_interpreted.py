"""Runs tests/kernels/test_kernels_triton.py under the Triton interpreter, in a child process.

``TRITON_INTERPRET=1`` must be set before triton is first imported (transformers imports it early),
and set in this process it would reach every other test and the workers they start.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA test_kernels_triton runs compiled, in-process")
def test_triton_kernels_match_their_references_under_the_interpreter() -> None:
    if not CI:
        pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("PAGEDQ_KERNEL_BACKEND", None)
    module = "tests/kernels/test_kernels_triton.py"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{result.stdout[-8000:]}\n{result.stderr[-2000:]}"
    assert " passed" in result.stdout and " error" not in result.stdout, result.stdout[-2000:]
