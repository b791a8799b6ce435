"""Smaller weights for CPU linears, through torch's dynamic quantization and fbgemm's kernels.

- ``fp16``: weights stored in float16 and widened to float32 inside fbgemm's packed GEMM, which then
  computes in float32. Half the bytes per step, outputs within about 2e-4 of float32's, batch invariant.
- ``int8``: weights int8 per output channel, activations quantized per step, u8 x s8 multiply-adds.
  Fastest at large batches, but the activations' scale is taken over the whole step, so a row's output
  shifts with the rows it shares a step with, and activation outliers cost accuracy (bench/RESULTS.md).

The embedding stays float32; a tied ``lm_head`` gets its own copy.
"""

import warnings

import torch
from torch import nn
from torch.ao.quantization import float16_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

QCONFIGS = {
    "fp16": (float16_dynamic_qconfig, torch.float16),
    "int8": (per_channel_dynamic_qconfig, torch.qint8),
}


def quantize_linears(model: nn.Module, quantization: str, device: torch.device) -> nn.Module:
    """``model`` with every ``nn.Linear`` replaced by its ``quantization``, or as it is for ``none``."""
    if quantization == "none":
        return model
    if device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on CPU only (fbgemm), not on {device}")
    if (dtype := model.embed_tokens.weight.dtype) != torch.float32:
        raise ValueError(f"quantization={quantization!r} quantizes float32 weights, not {dtype}")
    if model.lm_head.weight is model.embed_tokens.weight:
        model.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone(), requires_grad=False)
    qconfig, qdtype = QCONFIGS[quantization]
    with warnings.catch_warnings():  # torch flags its quantized tensors for a future move to torchao
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(model, {nn.Linear: qconfig}, dtype=qdtype, inplace=True)
