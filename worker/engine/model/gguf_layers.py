"""The linear and embedding layers of a model served from a GGUF file: their weights stay the file's
memory-mapped blocks (``GGUFTensor``), never a float32 copy."""

import torch
from torch import nn

from kernels import AttentionMetadata, fuses_gguf_layers, gguf_decoder_layer, quant_linear
from kernels.quant_reference import dequantize
from worker.engine.model.gguf_file import GGUFTensor
from worker.engine.model.llama import MLP_CHUNK_TOKENS, DecoderLayer, KVCache
from worker.engine.model.model_config import ModelConfig
from worker.engine.model.rotary import Rotation


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
    def ggml_types(self) -> list[int]:
        return [part.type.ggml_type for part in self.parts]

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


class FusedGGUFLayer:
    """A decoder layer whose linears are all quantized, run in one call of the CPU kernels
    (``kernels.gguf_decoder_layer``: the same kernels in the same order, so the same bits) where the step
    allows: the C++ kernels on this device, and every sequence attending in place. ``DecoderLayer``
    asks ``fits`` first, and runs its own modules one by one where not."""

    def __init__(self, layer: DecoderLayer, linears: list[GGUFLinear], config: ModelConfig) -> None:
        attn = layer.self_attn
        self.linears = [([p.data for p in linear.parts], linear.ggml_types) for linear in linears]
        self.norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        self.eps, self.scale, self.qkv_bias = config.rms_norm_eps, attn.scale, attn.qkv_proj.bias
        self.float_x, self.heads = not attn.qkv_proj.int8, (config.num_heads, config.num_kv_heads)

    @classmethod
    def of(cls, layer: DecoderLayer, config: ModelConfig) -> "FusedGGUFLayer | None":
        """``layer`` fused, or None where one of its linears is not quantized (a float part)."""
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        if not all(isinstance(linear, GGUFLinear) and linear.quantized for linear in linears):
            return None
        return cls(layer, linears, config)

    def fits(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        return x.shape[0] <= MLP_CHUNK_TOKENS and fuses_gguf_layers(x.device, meta)

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        rotation: Rotation,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return gguf_decoder_layer(
            x, residual, self.norms, self.eps, self.linears, self.qkv_bias, self.float_x,
            rotation, kv_cache, meta, self.scale, self.heads,
        )  # fmt: skip
