"""A ``.gguf`` file served as it is: its config, generation config and tokenizer (with its chat template)
come from the file's metadata, read by transformers and written once into the model cache, in
``<cache>/models/gguf/<stem>-<key>``, beside ``model.gguf``: a link to the file, never a copy of its
weights. That directory is what a Hugging Face directory with ``quantization="gguf"`` is (config.json,
tokenizer files, one .gguf), so the API's tokenizer and the worker's engine both load it as one. The key
is the file's absolute path, size and mtime: a file replaced in place is prepared again.

The file is checked first (``GGUFFile.open``: a readable GGUF of tensor types pagedq runs, none truncated;
an architecture ``gguf_loader`` runs), so a bad file fails at start with an error naming it.
"""

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from worker.engine.model.gguf_file import GGUFError, GGUFFile
from worker.engine.model.gguf_loader import ARCHITECTURES
from worker.engine.model_cache import default_cache_dir, file_lock, remove_leftovers

logger = logging.getLogger("pagedq.engine")

GGUF_LINK = "model.gguf"
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer.json", GGUF_LINK)


def prepare_gguf(path: Path, cache_dir: Path | None = None) -> Path:
    """The model directory of the ``.gguf`` file at ``path``, prepared on first use."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"model {str(path)!r}: no such .gguf file")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / "models" / "gguf" / f"{path.stem}-{_key(path)}"
    if _is_complete(target):
        return target
    check_gguf(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.parent / f"{target.name}.lock"):
        if not _is_complete(target):  # else another process prepared it while we waited
            remove_leftovers(target)
            with tempfile.TemporaryDirectory(prefix=f".{target.name}.build-", dir=target.parent) as tmp:
                out = Path(tmp) / "model"
                write_model_files(path, out)
                os.replace(out, target)
            logger.info("prepared %s's config and tokenizer in %s", path, target)
    return target


def check_gguf(path: Path) -> None:
    """Raises ``GGUFError`` naming ``path`` for a file pagedq cannot serve."""
    file = GGUFFile.open(path)  # reads the header and every tensor's type and extent
    if file.architecture not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {file.architecture!r} is not supported; pagedq serves GGUF files of "
            f"{sorted(ARCHITECTURES)}"
        )
    if "rope_freqs.weight" in file.tensors:  # Llama 3.1's rope scaling, which the metadata does not say
        raise GGUFError(
            f"{path}: its rotary frequencies are scaled per dimension (a rope_freqs.weight tensor), which "
            "pagedq does not read from a .gguf file; serve a Hugging Face directory holding its config.json "
            "and this file, with quantization='gguf'"
        )


def write_model_files(path: Path, out: Path) -> None:
    """``out``: a link to the file, and the config, generation config and tokenizer its metadata says."""
    out.mkdir(parents=True)
    (out / GGUF_LINK).symlink_to(path)
    write_metadata_files(out / GGUF_LINK, out)  # read while the link is alone in its folder


def write_metadata_files(gguf: Path, out: Path) -> None:
    """Into ``out``: the config, generation config and tokenizer that the metadata of ``gguf`` says. They
    are read from the file's folder, which must hold nothing else: transformers prefers a tokenizer.json
    it finds beside the file to the file's own."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.__dict__.pop("_model_name_or_path", None)
    tokenizer.model_max_length = config.max_position_embeddings
    generation = GenerationConfig.from_model_config(config)
    eot = GGUFFile.open(gguf).metadata.get("tokenizer.ggml.eot_token_id")
    if isinstance(eot, int) and eot != config.eos_token_id:  # a chat model's end of turn ends it too
        generation.eos_token_id = [config.eos_token_id, eot]
    tokenizer.save_pretrained(out)
    config.save_pretrained(out)
    generation.save_pretrained(out)


def _key(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)
