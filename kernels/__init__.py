"""Paged-attention ops: the plain-torch reference implementations.

These run the engine on CPU and are the oracle that the Triton kernels are tested against;
the Triton versions will sit beside them with the same signatures.
"""

from kernels.metadata import AttentionMetadata
from kernels.reference import copy_blocks, paged_attention, write_kv

__all__ = ["AttentionMetadata", "copy_blocks", "paged_attention", "write_kv"]
