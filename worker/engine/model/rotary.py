"""Rotary position embeddings, with every RoPE scaling scheme transformers knows (llama3, linear, ...)."""

from typing import NamedTuple

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kernels import rotate


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
    """Precomputed cos/sin for every position, looked up once per step by each token's position.

    ``sin`` is stored as ``[-sin | sin]`` so that ``rotate_half(x) * sin`` becomes ``x.roll(D/2) * sin``:
    the same products as Hugging Face's, in four ops instead of five, for q and k together.
    """

    def __init__(
        self, config: PretrainedConfig, head_dim: int, max_positions: int, dtype: torch.dtype
    ) -> None:
        super().__init__()
        inv_freq, scaling = inverse_frequencies(config, head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float, device="cpu"), inv_freq)
        cos, sin = angles.cos() * scaling, angles.sin() * scaling
        self.register_buffer("cos", torch.cat([cos, cos], dim=-1).to(dtype), persistent=False)
        self.register_buffer("signed_sin", torch.cat([-sin, sin], dim=-1).to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor) -> "Rotation":
        return Rotation(self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1))


class Rotation(NamedTuple):
    """One step's cos and signed sin, ``[T, 1, D]``, shared by every layer."""

    cos: torch.Tensor
    signed_sin: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[T, heads, D]`` (queries and keys together, when they sit side by side); the CPU
        kernel rotates in place."""
        return rotate(x, self.cos, self.signed_sin)
