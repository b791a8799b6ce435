"""What serves a request, for its manifest: the model's and the tokenizer's content digests, pagedq's
version, and the numerics that decide its tokens (device, dtype, quantization, kernels, batch invariance).

The model digest is sha256 over its weight files (name and bytes, in name order), read once and cached
beside the model (``.pagedq-digest.json``, keyed by each file's size and mtime): a worker's start reads
gigabytes only the first time a model is served.
"""

import hashlib
import json
import logging
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.engine.llm_engine import LLMEngine

logger = logging.getLogger("pagedq.engine")

WEIGHTS = ("*.safetensors", "*.bin", "*.pt")  # a GGUF-served model's: its .gguf file only
TOKENIZER = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
CACHE = ".pagedq-digest.json"


def files_digest(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def model_digest(path: Path, gguf: bool = False) -> str:
    """sha256 over the model's weight files, cached beside them while they are unchanged."""
    patterns = ("*.gguf",) if gguf else WEIGHTS
    files = sorted({file for pattern in patterns for file in path.glob(pattern)})
    stamp = [[file.name, file.stat().st_size, file.stat().st_mtime_ns] for file in files]
    cache = path / (f"{CACHE}.gguf" if gguf else CACHE)
    try:
        cached = json.loads(cache.read_text())
        if cached["files"] == stamp:
            return str(cached["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = files_digest(files)
    try:
        cache.write_text(json.dumps({"files": stamp, "sha256": digest}))
    except OSError as error:  # a read-only model folder: computed again at the next start
        logger.info("model digest not cached", extra={"path": str(cache), "error": str(error)})
    return digest


def tokenizer_digest(path: Path) -> str:
    return files_digest([path / name for name in TOKENIZER if (path / name).is_file()])


def pagedq_version() -> str:
    try:
        return metadata.version("pagedq")
    except metadata.PackageNotFoundError:
        return "unknown"


def served_by(engine: "LLMEngine") -> dict[str, Any]:
    """What serves the engine's requests, for their manifests."""
    runner, quantization = engine.runner, engine.config.quantization
    path = engine.model_path
    return {
        "model_digest": model_digest(path, gguf=quantization == "gguf"),
        "tokenizer_digest": tokenizer_digest(path),
        "pagedq_version": pagedq_version(),
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "quantization": quantization,
        "kernel_backend": runner.kernel_backend,
        "batch_invariant": runner.batch_invariant,
    }
