"""How the linear layers run on CPU: their weights repacked once at load, for the GEMM kernels that
suit a decode step's few rows.

- float32, batch-invariant (the default, ``EngineConfig.batch_invariant``): the C++ kernel
  ``kernels.cpu.invariant_linear``, whose every output is one fixed-order sum, the same bits whatever
  else the step holds: a prefill chunk, a decode step or a recompute give a row the same result, so a
  request's tokens do not depend on its batch. Where AVX2 is the CPU's widest, its weights are
  repacked in panels for a faster kernel of the same bits (``pack_invariant_linear``), except a tied
  ``lm_head``, which multiplies the embedding as it is (no copy); elsewhere they stay as they are.
- float32, ``batch_invariant=False``: oneDNN's blocked layout, through the op that torch's inductor
  uses for frozen CPU linears (it picks its blocking by row count: a row's bits change with its batch).
  The sums are float32 in a different order, so outputs differ from ``F.linear``'s in the
  last bits only, while steps of 1-16 rows run 1.3-3x faster and the vocabulary projection about 2x.
- ``quantization="fp16"``: float16 weights in fbgemm's packed layout (the kernels behind torch's dynamic
  quantization), widened to float32 inside the GEMM, which computes in float32: half the bytes, outputs
  within about 2e-4 of float32's. int8 (activations quantized per step) was measured faster still and
  left out: its outputs drift from float32 within a few tokens and shift with the rows a step batches
  (bench/RESULTS.md).

The embedding stays as it is (a tied ``lm_head`` gets its own packed copy); other dtypes and devices
keep ``nn.Linear``. The oneDNN ops are private to torch, so they are tried once on a tiny tensor before a
model relies on them (``onednn_works``): if they fail or disagree with ``F.linear``, the linears stay
``nn.Linear`` and one warning says why.
"""

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernels import backend_for, cpu

logger = logging.getLogger("pagedq.engine")


class OneDNNLinear(nn.Module):
    """``nn.Linear`` on a weight reordered once into oneDNN's layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 16)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        """``F.gelu(self(x))`` (erf, BERT's), as one oneDNN post-op."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "gelu", [], "none")

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``self(x) + other``, as one oneDNN post-op."""
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.packed, self.bias, "add")


class InvariantLinear(nn.Module):
    """``nn.Linear`` whose rows' outputs never depend on the other rows (``cpu.invariant_linear``);
    ``weight`` is nn.Linear's, or ``packed`` (``cpu.pack_invariant_linear``'s layout)."""

    def __init__(self, linear: nn.Linear, pack: bool = True) -> None:
        super().__init__()
        weight = linear.weight.detach()
        packed = cpu.pack_invariant_linear(weight) if pack else None
        self.weight, self.packed = (weight, False) if packed is None else (packed, True)
        self.out_features = linear.out_features
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return cpu.invariant_linear_packed(x, self.weight, self.out_features, self.bias)
        return cpu.invariant_linear(x, self.weight, self.bias)


class Fp16Linear(nn.Module):
    """``nn.Linear`` on float16 weights packed once for fbgemm."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        bias = None if linear.bias is None else linear.bias.detach()
        self.packed = torch.ops.quantized.linear_prepack_fp16(linear.weight.detach(), bias)
        self.nbytes = linear.weight.numel() * 2 + (0 if bias is None else bias.nbytes)  # what it packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


@functools.cache
def onednn_works() -> bool:
    """Whether ``OneDNNLinear`` runs and gives ``F.linear``'s outputs (to float32 rounding), with and
    without a bias, on a few rows; the first call of a process tries it."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)  # not the global one: sampling's stays as it was
    x = torch.randn(3, 32, generator=generator)
    for bias in (True, False):
        linear = nn.utils.skip_init(nn.Linear, 32, 16, bias=bias)
        for param in linear.parameters():
            param.data = torch.randn(param.shape, generator=generator)
        try:
            error = _onednn_error(OneDNNLinear(linear), linear, x)
        except Exception as failure:  # a private op gone, renamed or with another signature
            return _fall_back(f"{type(failure).__name__}: {' '.join(str(failure).split())[:300]}")
        if not error <= 1e-4:  # NaN too
            return _fall_back(f"outputs differ from F.linear's by {error:.3g}")
    return True


def _onednn_error(packed: OneDNNLinear, linear: nn.Linear, x: torch.Tensor) -> float:
    """The largest difference from ``F.linear`` of the plain op, then of its GELU and add post-ops (the
    encoder's); the post-ops are tried only where the plain op agrees."""
    reference = F.linear(x, linear.weight, linear.bias)
    error = (packed(x) - reference).abs().max().item()
    if not error <= 1e-4:
        return error
    gelu = (packed.gelu(x) - F.gelu(reference)).abs().max().item()
    return max(gelu, (packed.add(x, reference) - 2 * reference).abs().max().item())


def linear_gelu(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(linear(x))``, fused where the linear is oneDNN's (the encoder's MLP)."""
    return linear.gelu(x) if isinstance(linear, OneDNNLinear) else F.gelu(linear(x))


def linear_add(linear: nn.Module, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """``linear(x) + other``, fused where the linear is oneDNN's (the encoder's residuals)."""
    return linear.add(x, other) if isinstance(linear, OneDNNLinear) else linear(x) + other


def _fall_back(reason: str) -> bool:
    logger.warning("oneDNN linears unavailable, running F.linear: %s", reason, extra={"reason": reason})
    return False


def pack_linears(
    model: nn.Module, quantization: str, device: torch.device, batch_invariant: bool = False
) -> bool:
    """Repacks ``model``'s linears in place for the CPU (see the module's docstring). Returns whether
    they are batch-invariant (asked for, float32 on CPU, and the C++ kernels built)."""
    dtype = next(model.parameters()).dtype
    if quantization != "none" and (device.type != "cpu" or dtype != torch.float32):
        raise ValueError(
            f"quantization={quantization!r} packs float32 weights on CPU, not {dtype} on {device}"
        )
    if device.type != "cpu" or dtype != torch.float32:
        return False
    invariant = batch_invariant and quantization == "none" and backend_for(device) == "cpu"
    if invariant:
        embeddings = {m.weight.data_ptr() for m in model.modules() if isinstance(m, nn.Embedding)}
        _replace_linears(
            model, lambda linear: InvariantLinear(linear, linear.weight.data_ptr() not in embeddings)
        )
    elif quantization == "fp16":
        _replace_linears(model, Fp16Linear)
    elif onednn_works():
        _replace_linears(model, OneDNNLinear)
    return invariant


def _replace_linears(model: nn.Module, packed: Callable[[nn.Linear], nn.Module]) -> None:
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear):
                setattr(parent, name, packed(child))
