"""Pooling: a model's token states into one vector per input, as its sentence-transformers files say.

``read_pooling`` reads ``modules.json`` (Transformer -> Pooling -> optional Normalize), the Pooling
module's ``config.json`` and ``sentence_bert_config.json``'s ``max_seq_length``. A directory without
``modules.json`` pools as vLLM does by default: an encoder its CLS token, a decoder its last token, both
normalized. ``pool`` and ``finish`` run on a packed batch's hidden states.
"""

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from contract.pooling import Pooling, PoolingMode

# The Pooling module's config keys (sentence-transformers 2.x-5.x) and the modes they name.
MODE_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
UNSUPPORTED_KEYS = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


def read_pooling(path: Path, hf_config: dict, default_mode: PoolingMode) -> Pooling:
    """The pooling of the model in ``path``, whose config.json is ``hf_config``."""
    hidden, context = hf_config["hidden_size"], hf_config["max_position_embeddings"]
    modules = _read_json(path / "modules.json")
    if modules is None:
        mode, normalize = default_mode, True
    else:
        mode, normalize = _sentence_transformers_pooling(path, modules)
    bert_config = _read_json(path / "sentence_bert_config.json") or {}
    max_seq_length = min(bert_config.get("max_seq_length") or context, context)
    sizes = hf_config.get("matryoshka_dimensions") or ()
    return Pooling(mode, normalize, max_seq_length, hidden, tuple(size for size in sizes if size < hidden))


def _sentence_transformers_pooling(path: Path, modules: list[dict]) -> tuple[PoolingMode, bool]:
    kinds = [module["type"].rsplit(".", 1)[-1] for module in modules]
    if unknown := [kind for kind in kinds if kind not in KNOWN_MODULES]:
        raise ValueError(
            f"{path}/modules.json: modules {unknown} are not supported; pagedq runs {KNOWN_MODULES}"
        )
    if "Pooling" not in kinds:
        raise ValueError(f"{path}/modules.json names no Pooling module")
    pooling_dir = path / modules[kinds.index("Pooling")].get("path", "")
    config = _read_json(pooling_dir / "config.json") or {}
    return _pooling_mode(pooling_dir, config), "Normalize" in kinds


def _pooling_mode(where: Path, config: dict) -> PoolingMode:
    if isinstance(config.get("pooling_mode"), str):  # sentence-transformers' newer single key
        name = {"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(config["pooling_mode"])
        if name is None:
            raise ValueError(f"{where}: pooling mode {config['pooling_mode']!r} is not supported")
        return name  # type: ignore[return-value]
    if unsupported := [key for key in UNSUPPORTED_KEYS if config.get(key)]:
        raise ValueError(f"{where}/config.json: {unsupported} not supported; pagedq pools mean, cls or last")
    modes = [mode for key, mode in MODE_KEYS.items() if config.get(key)]
    if len(modes) != 1:
        raise ValueError(
            f"{where}/config.json: needs exactly one pooling mode of {list(MODE_KEYS)}, got {modes}"
        )
    return modes[0]


def _read_json(path: Path) -> dict | list | None:
    return json.loads(path.read_text()) if path.is_file() else None


def pool(hidden: torch.Tensor, lens: list[int], mode: PoolingMode) -> torch.Tensor:
    """``[inputs, hidden]`` from the packed ``[tokens, hidden]`` states of inputs of ``lens`` tokens."""
    if mode == "mean":
        lengths = torch.tensor(lens, device=hidden.device)
        return torch.segment_reduce(hidden.float(), "mean", lengths=lengths)
    ends = torch.tensor(lens, device=hidden.device).cumsum(0)
    rows = ends - torch.tensor(lens, device=hidden.device) if mode == "cls" else ends - 1
    return hidden[rows].float()


def finish(vectors: torch.Tensor, normalize: bool, dimensions: int | None) -> torch.Tensor:
    """Keep the first ``dimensions`` values (all without it), then scale to unit length if ``normalize``."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    return F.normalize(vectors, p=2.0, dim=-1) if normalize else vectors
