"""Build the BERT encoder and fill it from a Hugging Face checkpoint's safetensors files (memory-mapped)."""

import json
import logging
import re
from pathlib import Path

import torch
from safetensors import safe_open

from worker.engine.model.bert import BertConfig, BertModel
from worker.engine.model.cpu_linears import pack_linears

logger = logging.getLogger("pagedq.engine")

# Hugging Face's names inside ``encoder.layer.N.`` -> the encoder's (and, for q/k/v, the shard of the fused
# projection they fill).
LAYER_NAMES = {
    "attention.self.query": ("qkv", 0),
    "attention.self.key": ("qkv", 1),
    "attention.self.value": ("qkv", 2),
    "attention.output.dense": ("attention_out", None),
    "attention.output.LayerNorm": ("attention_norm", None),
    "intermediate.dense": ("intermediate", None),
    "output.dense": ("output", None),
    "output.LayerNorm": ("output_norm", None),
}
LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
IGNORED = ("embeddings.position_ids", "pooler.")  # a buffer of 0..n, and the unused [CLS] pooler


def load_bert(path: Path, dtype: torch.dtype, device: torch.device, quantization: str = "none") -> BertModel:
    """The encoder of the checkpoint in ``path``, its linears packed for the device."""
    config = BertConfig.from_hf(json.loads((path / "config.json").read_text()))
    with torch.device(device):
        model = BertModel(config)
    fill_from_safetensors(model, path)
    model.to(dtype)
    pack_linears(model, quantization, device)
    return model.eval().requires_grad_(False)


def fill_from_safetensors(model: BertModel, path: Path) -> None:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights found")
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name := load_tensor(params, key, f.get_tensor(key), path):
                    loaded.add(name)
    if missing := set(params) - loaded:
        raise ValueError(f"{path}: checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    logger.info("loaded %d tensors from %d safetensors file(s) in %s", len(loaded), len(files), path)


def load_tensor(
    params: dict[str, torch.nn.Parameter], key: str, tensor: torch.Tensor, path: Path
) -> str | None:
    """Copy one checkpoint tensor into its place; returns the parameter it filled (None: ignored)."""
    name = key.removeprefix("bert.")
    if name.startswith(IGNORED) or name.startswith("cls."):  # a masked-LM head, unused
        return None
    shard = None
    if match := LAYER_KEY.fullmatch(name):
        layer, part, kind = match.groups()
        if part not in LAYER_NAMES:
            raise ValueError(f"{path}: unexpected tensor {key!r} in checkpoint")
        target, shard = LAYER_NAMES[part]
        name = f"layers.{layer}.{target}.{kind}"
    if name not in params:
        raise ValueError(f"{path}: unexpected tensor {key!r} in checkpoint")
    param = params[name].data
    if shard is not None:
        size = param.shape[0] // 3
        param = param[shard * size : (shard + 1) * size]
    if param.shape != tensor.shape:
        raise ValueError(f"{path}: {key!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    param.copy_(tensor)
    return name
