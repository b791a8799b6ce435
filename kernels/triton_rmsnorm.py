"""RMSNorm in Triton, optionally fused with the residual add before it: one program per row.

Rounds where the torch reference rounds (the sum to the model dtype, the normalised row before the
weight), so low-precision outputs match it, and Hugging Face, to the last bit but for summation order.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.triton_common import check_runnable, pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, sum_ptr, eps,
    stride_x, stride_r, stride_o, stride_s,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        total = (x + r).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_s + cols, total, mask=mask)
        x = total.to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, 0) / HIDDEN + eps)
    normed = normed.to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight * rmsnorm(x)`` over the last dimension of a 2-D ``x``."""
    out = torch.empty_like(x)
    _launch(x, None, weight, eps, out, out)
    return out


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(weight * rmsnorm(x + residual), x + residual)`` in one pass."""
    out, total = torch.empty_like(x), torch.empty_like(x)
    _launch(x, residual, weight, eps, out, total)
    return out, total


def _launch(
    x: Tensor, residual: Tensor | None, weight: Tensor, eps: float, out: Tensor, total: Tensor
) -> None:
    check_runnable(_rms_norm_kernel, x)
    if x.dim() != 2 or x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError(f"x must be 2-D with contiguous rows, got {tuple(x.shape)} strides {x.stride()}")
    rows, hidden = x.shape
    res = x if residual is None else residual
    _rms_norm_kernel[(rows,)](
        x, res, weight, out, total, eps,
        x.stride(0), res.stride(0), out.stride(0), total.stride(0),
        HIDDEN=hidden, BLOCK=pow2(hidden), HAS_RESIDUAL=residual is not None,
        num_warps=min(16, max(1, pow2(hidden) // 512)),
    )  # fmt: skip
