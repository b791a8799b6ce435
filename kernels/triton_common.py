"""What the Triton kernels share: the check that a launch can run, and small launch arithmetic."""

import triton
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction


def check_runnable(kernel: object, tensor: Tensor) -> None:
    """Raise a clear error where Triton would fail obscurely: CPU tensors need the interpreter."""
    if not tensor.is_cuda and not isinstance(kernel, InterpretedFunction):
        raise RuntimeError(
            "Triton kernels on CPU tensors run only under the interpreter: set TRITON_INTERPRET=1 "
            "before kernels.triton_* are imported, or use the torch reference (PAGEDQ_KERNEL_BACKEND=torch)"
        )


def pow2(n: int) -> int:
    return triton.next_power_of_2(n)
