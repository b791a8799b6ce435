"""The engine's kernels behind one interface (``kernels.dispatch``): Triton on CUDA, the torch
reference (``kernels.reference``) on CPU and as the oracle the Triton kernels are tested against."""

from kernels.dispatch import add_rms_norm, backend_for, paged_attention, rms_norm, silu_and_mul, write_kv
from kernels.metadata import AttentionMetadata
from kernels.reference import copy_blocks

__all__ = [
    "AttentionMetadata",
    "add_rms_norm",
    "backend_for",
    "copy_blocks",
    "paged_attention",
    "rms_norm",
    "silu_and_mul",
    "write_kv",
]
