"""Build the model and fill it from safetensors files (memory-mapped), with random weights, or from a
GGUF file with its weights kept quantized (``gguf_loader``)."""

import logging
from pathlib import Path

import torch
from safetensors import safe_open

from kernels import backend_for
from worker.engine.model.cpu_linears import pack_linears
from worker.engine.model.gguf_loader import find_gguf, load_gguf_model
from worker.engine.model.llama import LlamaForCausalLM
from worker.engine.model.model_config import ModelConfig

logger = logging.getLogger("pagedq.engine")

# Hugging Face checkpoints keep q/k/v and gate/up apart; the model runs them fused.
FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def load_model(
    config: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    load_format: str,
    quantization: str = "none",
    seed: int = 0,
    batch_invariant: bool = False,
    gguf_kernel: str = "float",
) -> LlamaForCausalLM:
    """The model, filled and with its linears packed for the device (``cpu_linears.pack_linears``); its
    ``batch_invariant`` says whether they came out batch-invariant."""
    if quantization == "gguf":
        model = load_gguf(config, max_positions, dtype, device, load_format, gguf_kernel)
        # Both GGUF kernel paths compute a row from that row alone, in a fixed order.
        model.batch_invariant = batch_invariant and backend_for(device) == "cpu"
        return model
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config, max_positions, dtype)
    finally:
        torch.set_default_dtype(default_dtype)
    model.to(device)
    if load_format == "dummy":
        fill_random(model, seed)
    else:
        fill_from_safetensors(model, config)
    model.batch_invariant = pack_linears(model, quantization, device, batch_invariant)
    return model.eval().requires_grad_(False)


def load_gguf(
    config: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    load_format: str,
    kernel: str = "float",
) -> LlamaForCausalLM:
    if device.type != "cpu" or dtype != torch.float32 or load_format != "safetensors":
        raise ValueError(
            f"quantization='gguf' runs a .gguf file's weights on CPU with float32 activations, not "
            f"{dtype} on {device} (load_format {load_format!r})"
        )
    if config.path is None:
        raise ValueError("quantization='gguf' needs a model directory")
    return load_gguf_model(config, max_positions, find_gguf(config.path), int8=kernel == "int8")


def fill_random(model: LlamaForCausalLM, seed: int = 0) -> None:
    """Weights of the right shapes for benchmarks: small normal values, unit norms."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02, generator=generator)


def fill_from_safetensors(model: LlamaForCausalLM, config: ModelConfig) -> None:
    files = sorted(Path(config.path).glob("*.safetensors")) if config.path else []
    if not files:
        raise FileNotFoundError(f"{config.path}: no *.safetensors weights found")
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                name = load_tensor(params, key, f.get_tensor(key), config)
                if name:
                    loaded.add(name)
    missing = set(params) - loaded - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing:
        raise ValueError(
            f"{config.path}: checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}"
        )
    logger.info("loaded %d tensors from %d safetensors file(s) in %s", len(loaded), len(files), config.path)


def load_tensor(params: dict, key: str, tensor: torch.Tensor, config: ModelConfig) -> str | None:
    """Copy one checkpoint tensor into its place; returns the parameter name it filled."""
    name = key.removeprefix("model.")
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return None
    for part, (fused, shard) in FUSED.items():
        if f".{part}." in name:
            target = name.replace(part, fused)
            fused_rows(params[target], shard, config, part).copy_(tensor)
            return target
    if name not in params:
        if "rotary_emb" in name:
            return None
        raise ValueError(f"{config.path}: unexpected tensor {key!r} in checkpoint")
    params[name].data.copy_(tensor)
    return name


def fused_rows(param: torch.Tensor, shard: int, config: ModelConfig, part: str) -> torch.Tensor:
    if part.startswith("mlp"):
        size = config.intermediate_size
        return param.data[shard * size : (shard + 1) * size]
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    offsets = [0, q, q + kv, q + 2 * kv]
    return param.data[offsets[shard] : offsets[shard + 1]]
