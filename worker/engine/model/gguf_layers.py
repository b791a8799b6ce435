"""The linear and embedding layers of a model served from a GGUF file: their weights stay the file's
memory-mapped blocks (``GGUFTensor``), never a float32 copy."""

import torch
from torch import nn

from kernels import quant_linear
from kernels.quant_reference import dequantize
from worker.engine.model.gguf_file import GGUFTensor


def float_rows(tensor: GGUFTensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """``tensor``'s rows (all of them, or those indexed by ``rows``) in float32."""
    data = tensor.data if rows is None else tensor.data.index_select(0, rows)
    return dequantize(data, tensor.type.name)


class GGUFLinear(nn.Module):
    """``x @ cat(parts).T (+ bias)`` with the parts' rows side by side (a fused q/k/v or gate/up
    projection whose parts the file may store in different types). Quantized parts run in the quantized
    kernels (``kernels.quant_linear``: ``int8`` picks its integer path); float parts (rare: F32/F16/BF16
    matrices) as float32."""

    def __init__(self, parts: list[GGUFTensor], bias: torch.Tensor | None = None, int8: bool = False) -> None:
        super().__init__()
        self.parts, self.int8 = parts, int8
        self.quantized = all(part.type.dequantize_blocks is not None for part in parts)
        self.dense = None if self.quantized else torch.cat([float_rows(part) for part in parts])
        self.bias = bias

    @property
    def type_names(self) -> list[str]:
        return [part.type.name for part in self.parts]

    @property
    def weight_bytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            out = x @ self.dense.T
        else:
            parts = [p.data for p in self.parts]
            out = quant_linear(x.reshape(-1, x.shape[-1]), parts, self.type_names, self.int8)
            out = out.view(*x.shape[:-1], -1)
        return out if self.bias is None else out + self.bias


class GGUFEmbedding(nn.Module):
    """Token embeddings looked up in the file's blocks: only the rows of a step's tokens are
    de-quantized."""

    def __init__(self, table: GGUFTensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return float_rows(self.table, input_ids)
