"""SiLU(gate) * up in Triton, reading both halves of the fused gate_up projection in one pass."""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.triton_common import check_runnable

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + WIDTH + cols, mask=mask, other=0.0).to(tl.float32)
    # Round SiLU's output to the model dtype first, as torch's two ops do.
    silu = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(x[:, :I]) * x[:, I:]`` for ``x`` of shape ``[T, 2I]``."""
    check_runnable(_silu_and_mul_kernel, x)
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, 2I] with contiguous rows, got {tuple(x.shape)}")
    rows, width = x.shape[0], x.shape[1] // 2
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    _silu_and_mul_kernel[(rows, triton.cdiv(width, BLOCK))](x, out, x.stride(0), out.stride(0), width, BLOCK)
    return out
