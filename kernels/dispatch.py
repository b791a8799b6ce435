"""One interface to the kernels: Triton on CUDA tensors, the C++ CPU kernels on CPU tensors, the torch
reference wherever those are not.

``PAGEDQ_KERNEL_BACKEND`` picks: ``auto`` (the default: by the tensor's device, the C++ kernels on CPU
tensors, Triton on CUDA ones), ``torch`` (the reference everywhere, e.g. to rule the kernels out),
``cpu`` (the CPU kernels on CPU tensors, the reference on others) or ``triton`` (everywhere; on CPU
tensors only under ``TRITON_INTERPRET=1``, which is how the tests run the kernels without a GPU). The
Triton modules are imported on first use, so a CPU engine never loads them, and triton is an optional
dependency (the ``gpu`` extra): without it ``auto`` runs the reference on CUDA tensors too, and says so
once. The CPU kernels are built on first use (``kernels/cpu.py``), and when they cannot be, ``auto`` and
``cpu`` run the reference.
"""

import functools
import logging
import os

import torch
from torch import Tensor

from kernels import cpu, quant_reference, reference
from kernels.metadata import AttentionMetadata

logger = logging.getLogger("pagedq.kernels")

BACKEND_ENV = "PAGEDQ_KERNEL_BACKEND"
BACKENDS = ("auto", "torch", "cpu", "triton")


def backend_for(device: torch.device) -> str:
    """``"triton"``, ``"cpu"`` or ``"torch"``: which implementation runs on tensors on ``device``."""
    choice = os.environ.get(BACKEND_ENV, "auto")
    if choice not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, got {choice!r}")
    if choice == "triton" and not triton_installed():
        raise RuntimeError(
            f"{BACKEND_ENV}=triton needs triton, which is not installed: pip install 'pagedq[gpu]'"
        )
    if choice in ("torch", "triton"):
        return choice
    if device.type == "cpu":
        return "cpu" if cpu.available() else "torch"
    return "triton" if choice == "auto" and device.type == "cuda" and triton_installed() else "torch"


@functools.cache
def triton_installed() -> bool:
    """Whether triton imports; asked only where a CUDA tensor or ``PAGEDQ_KERNEL_BACKEND`` wants it."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        logger.warning(
            "triton is not installed (pip install 'pagedq[gpu]'): no Triton kernels",
            extra={"error": str(error)},
        )
        return False
    return True


def encoder_attention(qkv: Tensor, lens: list[int], heads: int) -> Tensor:
    if backend_for(qkv.device) == "cpu":
        return cpu.encoder_attention(qkv, lens, heads)
    return reference.encoder_attention(qkv, lens, heads)


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    backend = backend_for(key.device)
    if backend == "triton":
        from kernels.triton_write_kv import write_kv as triton_write_kv

        return triton_write_kv(key, value, k_cache, v_cache, slot_mapping)
    if backend == "cpu" and key.dtype == k_cache.dtype:
        return cpu.write_kv(key, value, k_cache, v_cache, slot_mapping)
    return reference.write_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float
) -> Tensor:
    backend = backend_for(query.device)
    if backend == "triton":
        from kernels.triton_paged_attention import paged_attention as triton_paged_attention

        return triton_paged_attention(query, k_cache, v_cache, meta, scale)
    if backend == "cpu":
        return cpu.paged_attention(query, k_cache, v_cache, meta, scale)
    return reference.paged_attention(query, k_cache, v_cache, meta, scale)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    if backend_for(x.device) == "triton":
        from kernels.triton_rmsnorm import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    backend = backend_for(x.device)
    if backend == "triton":
        from kernels.triton_rmsnorm import add_rms_norm as triton_add_rms_norm

        return triton_add_rms_norm(x, residual, weight, eps)
    if backend == "cpu":
        return cpu.add_rms_norm(x, residual, weight, eps)
    return reference.add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: Tensor) -> Tensor:
    backend = backend_for(x.device)
    if backend == "triton":
        from kernels.triton_activation import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(x)
    if backend == "cpu":
        return cpu.silu_and_mul(x)
    return reference.silu_and_mul(x)


def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """``x * cos + roll(x, D / 2) * signed_sin``; the CPU kernel rotates ``x`` in place."""
    if backend_for(x.device) == "cpu":
        return cpu.rotate(x, cos, signed_sin)
    return reference.rotate(x, cos, signed_sin)


def quant_linear(x: Tensor, weights: list[Tensor], type_names: list[str], int8: bool = False) -> Tensor:
    """``x`` (float32 ``[M, K]``) times GGUF-quantized weights side by side: ``[M, sum N_i]``. The C++
    kernel de-quantizes the weights in registers and multiplies in float32, or with ``int8`` quantizes
    the activations per 32-value block for integer dot products; the reference de-quantizes the weights
    a few thousand rows at a time and multiplies in float32."""
    if backend_for(x.device) == "cpu":
        types = [quant_reference.TYPES[name].ggml_type for name in type_names]
        return cpu.quant_linear(x, weights, types, int8=int8)
    parts = [quant_reference.linear(x, w, name) for w, name in zip(weights, type_names, strict=True)]
    return torch.cat(parts, dim=-1)


def fuses_gguf_layers(device: torch.device, meta: AttentionMetadata) -> bool:
    """Whether ``gguf_decoder_layer`` runs this step on ``device``: the C++ kernels run there, and every
    sequence attends in place (no long prefill)."""
    return backend_for(device) == "cpu" and cpu.attends_in_place(meta)


gguf_decoder_layer = cpu.gguf_decoder_layer
