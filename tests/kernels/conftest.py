"""test_kernels_triton.py runs compiled on CUDA, or under the Triton interpreter in the child process that
test_kernels_interpreted.py starts; elsewhere it is not collected, rather than collected and skipped."""

import os

import torch

RUNS_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
collect_ignore = [] if RUNS_HERE else ["test_kernels_triton.py"]
