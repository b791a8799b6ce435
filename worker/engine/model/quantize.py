"""Float16 weights for CPU linears, through torch's dynamic quantization and fbgemm's packed GEMM.

fbgemm stores the weights in float16 and widens them to float32 inside its kernel, which computes in
float32: half the bytes per step, outputs within about 2e-4 of float32's, and no dependence on the
other rows of a step. int8 (activations quantized per step) was measured faster still and left out:
its outputs drift from float32 within a few tokens and shift with the rows a step batches
(bench/RESULTS.md). The embedding stays float32; a tied ``lm_head`` gets its own copy.
"""

import warnings

import torch
from torch import nn
from torch.ao.quantization import float16_dynamic_qconfig, quantize_dynamic


def quantize_linears(model: nn.Module, quantization: str, device: torch.device) -> nn.Module:
    """``model`` with every ``nn.Linear`` on float16 weights for ``fp16``; as it is for ``none``."""
    if quantization == "none":
        return model
    if device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs on CPU only (fbgemm), not on {device}")
    if (dtype := model.embed_tokens.weight.dtype) != torch.float32:
        raise ValueError(f"quantization={quantization!r} packs float32 weights, not {dtype}")
    if model.lm_head.weight is model.embed_tokens.weight:
        model.lm_head.weight = nn.Parameter(model.embed_tokens.weight.detach().clone(), requires_grad=False)
    with warnings.catch_warnings():  # torch flags its quantized modules for a future move to torchao
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(
            model, {nn.Linear: float16_dynamic_qconfig}, dtype=torch.float16, inplace=True
        )
