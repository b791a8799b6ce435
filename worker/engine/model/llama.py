"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2) over a flattened batch of tokens.

Every step runs one forward pass over the new tokens of all scheduled sequences, concatenated:
prefill chunks and single-token decodes alike. Attention reads past K/V from the paged cache.
"""

from typing import Protocol

import torch
from torch import nn

from kernels import AttentionMetadata, add_rms_norm, paged_attention, rms_norm, silu_and_mul, write_kv
from worker.engine.model.model_config import ModelConfig
from worker.engine.model.rotary import RotaryEmbedding, Rotation

# Prefills run the MLP 1024 tokens at a time: on CPU its [tokens, 2 x intermediate] temporaries then
# stay cache-sized and below malloc's mmap threshold instead of page-faulting fresh on every layer
# (a 4096-token SmolLM2 prefill step: 8.2 -> 5.4 s). Decode batches are never split.
MLP_CHUNK_TOKENS = 1024

KVCache = tuple[torch.Tensor, torch.Tensor]  # one layer's (keys, values) block pool


class FusedLayer(Protocol):
    """A decoder layer's whole forward in one call, where ``fits`` says the step allows it."""

    def fits(self, x: torch.Tensor, meta: AttentionMetadata) -> bool: ...

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        rotation: Rotation,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def empty_param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = empty_param(size)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``, fused on GPU and CPU."""
        return add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.scale = self.head_dim**-0.5

    def forward(
        self, x: torch.Tensor, rotation: Rotation, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        qk, v = self.qkv_proj(x).split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = rotation.apply(qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim))
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        write_kv(k, v, kv_cache[0], kv_cache[1], meta.slot_mapping)
        out = paged_attention(q, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= MLP_CHUNK_TOKENS:
            return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
        return torch.cat([self(part) for part in x.split(MLP_CHUNK_TOKENS)])


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        # All of it in one kernel call where the weights and the step allow (a GGUF model's
        # FusedGGUFLayer, set by its loader)
        self.fused: FusedLayer | None = None

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rotation: Rotation,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp_out, residual)``: their sum is the layer's output. The next layer adds them in its fused
        add + RMSNorm, one pass over the hidden states fewer per layer."""
        if residual is not None and self.fused is not None and self.fused.fits(x, meta):
            return self.fused(x, residual, rotation, kv_cache, meta)
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        attn = self.self_attn(h, rotation, kv_cache, meta)
        h, residual = self.post_attention_layernorm.add_forward(attn, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.config = config
        self.rotary = RotaryEmbedding(config.hf_config, config.head_dim, max_positions, dtype)
        # Uninitialised: every loader fills it (and normal_ on the meta device, where the GGUF loader builds
        # the skeleton, imports torch's Python decompositions: ~150 MB of modules).
        table = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.batch_invariant = False  # whether a row's outputs do not depend on its batch (set at load)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states of every new token, [T, hidden] (before the final norm)."""
        x, rotation = self.embed_tokens(input_ids), self.rotary(positions)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rotation, kv_cache, meta)
        return x + residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()
