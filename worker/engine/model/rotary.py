"""Rotary position embeddings, with every RoPE scaling scheme transformers knows (llama3, linear, ...)."""

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def inverse_frequencies(config: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        base = rope["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim)), 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    return ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))


class RotaryEmbedding(torch.nn.Module):
    """Precomputed cos/sin for every position, looked up by each token's position."""

    def __init__(
        self, config: PretrainedConfig, head_dim: int, max_positions: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        inv_freq, scaling = inverse_frequencies(config, head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float, device="cpu"), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", (angles.cos() * scaling).to(dtype), persistent=False)
        self.register_buffer("sin", (angles.sin() * scaling).to(dtype), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, D], k: [T, kv_heads, D]."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
