"""The few facts about a Hugging Face model directory that the engine needs."""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

SUPPORTED_ARCHITECTURES = {"llama", "mistral", "qwen2"}


@dataclass(frozen=True)
class ModelConfig:
    hf_config: PretrainedConfig
    path: Path | None

    @classmethod
    def from_pretrained(cls, path: Path) -> "ModelConfig":
        hf_config = AutoConfig.from_pretrained(path)
        if hf_config.model_type not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"{path}: model_type {hf_config.model_type!r} is not supported; "
                f"pagedq runs {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        return cls(hf_config, path)

    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.hf_config.hidden_size

    @property
    def num_heads(self) -> int:
        return self.hf_config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return getattr(self.hf_config, "num_key_value_heads", None) or self.num_heads

    @property
    def head_dim(self) -> int:
        return getattr(self.hf_config, "head_dim", None) or self.hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        return self.hf_config.intermediate_size

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    @property
    def rms_norm_eps(self) -> float:
        return self.hf_config.rms_norm_eps

    @property
    def qkv_bias(self) -> bool:
        return self.hf_config.model_type == "qwen2" or bool(getattr(self.hf_config, "attention_bias", False))

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(getattr(self.hf_config, "tie_word_embeddings", False))

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(self.hf_config, "dtype", None) or getattr(self.hf_config, "torch_dtype", None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        return dtype or torch.float32

    @property
    def eos_token_ids(self) -> list[int]:
        eos = self.hf_config.eos_token_id
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        element = torch.tensor([], dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element
