"""A model's ``Pooling`` read from its sentence-transformers files, for the engine and the API alike.

``read_pooling`` reads ``modules.json`` (Transformer -> Pooling -> optional Normalize), the Pooling
module's ``config.json`` and ``sentence_bert_config.json``'s ``max_seq_length``. A directory without
``modules.json`` pools as vLLM does by default: an encoder its CLS token, a decoder its last token, both
normalized.
"""

import json
from pathlib import Path

from contract.pooling import Pooling, PoolingMode

ENCODERS = frozenset({"bert"})  # model types that are encoders (CLS by default); the rest are decoders


def default_mode(model_type: str) -> PoolingMode:
    """How a model without ``modules.json`` pools: an encoder its CLS token, a decoder its last."""
    return "cls" if model_type in ENCODERS else "last"


def model_pooling(path: Path) -> Pooling:
    """The pooling of the model directory ``path``, from its own ``config.json``."""
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{path} has no config.json")
    return read_pooling(path, config, default_mode(config.get("model_type", "")))


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
