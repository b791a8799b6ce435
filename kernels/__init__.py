"""The engine's kernels behind one interface (``kernels.dispatch``): Triton on CUDA, C++ (``kernels.cpu``)
on CPU, and the torch reference (``kernels.reference``) where neither runs and as the oracle both are
tested against."""

from kernels.dispatch import (
    add_rms_norm,
    backend_for,
    encoder_attention,
    fuses_gguf_layers,
    gguf_decoder_layer,
    paged_attention,
    quant_linear,
    rms_norm,
    rotate,
    silu_and_mul,
    write_kv,
)
from kernels.metadata import AttentionMetadata
from kernels.reference import copy_blocks

__all__ = [
    "AttentionMetadata",
    "add_rms_norm",
    "backend_for",
    "copy_blocks",
    "encoder_attention",
    "fuses_gguf_layers",
    "gguf_decoder_layer",
    "paged_attention",
    "quant_linear",
    "rms_norm",
    "rotate",
    "silu_and_mul",
    "write_kv",
]
