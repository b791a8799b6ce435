"""One interface to the kernels: Triton on CUDA tensors, the torch reference elsewhere.

``PAGEDQ_KERNEL_BACKEND`` picks: ``auto`` (the default: by the tensor's device), ``torch`` (the
reference everywhere, e.g. to rule the kernels out) or ``triton`` (everywhere; on CPU tensors only
under ``TRITON_INTERPRET=1``, which is how the tests run the kernels without a GPU). The Triton
modules are imported on first use, so a CPU engine never loads them.
"""

import os

import torch
from torch import Tensor

from kernels import reference
from kernels.metadata import AttentionMetadata

BACKEND_ENV = "PAGEDQ_KERNEL_BACKEND"
BACKENDS = ("auto", "torch", "triton")


def backend_for(device: torch.device) -> str:
    """``"triton"`` or ``"torch"``: which implementation runs on tensors on ``device``."""
    choice = os.environ.get(BACKEND_ENV, "auto")
    if choice not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, got {choice!r}")
    if choice == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return choice


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    if backend_for(key.device) == "triton":
        from kernels.triton_write_kv import write_kv as triton_write_kv

        return triton_write_kv(key, value, k_cache, v_cache, slot_mapping)
    return reference.write_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float
) -> Tensor:
    if backend_for(query.device) == "triton":
        from kernels.triton_paged_attention import paged_attention as triton_paged_attention

        return triton_paged_attention(query, k_cache, v_cache, meta, scale)
    return reference.paged_attention(query, k_cache, v_cache, meta, scale)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    if backend_for(x.device) == "triton":
        from kernels.triton_rmsnorm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if backend_for(x.device) == "triton":
        from kernels.triton_rmsnorm import add_rms_norm as triton_add_rms_norm

        return triton_add_rms_norm(x, residual, weight, eps)
    return reference.add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: Tensor) -> Tensor:
    if backend_for(x.device) == "triton":
        from kernels.triton_activation import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(x)
    return reference.silu_and_mul(x)
