"""A ``.gguf`` file as a model's source: its config and tokenizer come from its own metadata, prepared once
in the cache beside a link to the file, and it serves the same tokens as the directory holding that file
with the Hugging Face config (``quantization="gguf"``). A file pagedq cannot serve fails at start, naming
the file."""

import json
from pathlib import Path

import numpy as np
import pytest

from contract.sampling import SamplingParams
from core.served_models import parse_models
from tests.support.gguf_files import write_gguf
from worker.engine import LLM
from worker.engine.gguf_source import GGUF_LINK, prepare_gguf
from worker.engine.model.gguf_file import GGUFError

ENGINE = {"kv_cache_bytes": 4 << 20, "max_num_seqs": 8}
PROMPTS = ["The quick brown fox", "def add(a, b):", "héllo wörld 🙂"]
CHAT = [[{"role": "user", "content": "Paged attention stores keys"}]]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PAGEDQ_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def greedy(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def test_a_gguf_file_serves_the_tokens_of_its_directory_with_no_weights_copied(
    tiny_llama_gguf: Path, cache: Path
) -> None:
    file = tiny_llama_gguf / "model.gguf"
    [entry] = parse_models(json.dumps([{"name": "llama-q", "source": str(file)}]))
    assert entry.quantization == "gguf"  # a .gguf file's default

    from_file = LLM(entry.source, **ENGINE)
    from_dir = LLM(str(tiny_llama_gguf), quantization="gguf", **ENGINE)

    tokens = [
        [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy())] for llm in (from_file, from_dir)
    ]
    assert tokens[0] == tokens[1]
    chats = [llm.chat(CHAT, greedy())[0] for llm in (from_file, from_dir)]
    assert chats[0].prompt_token_ids == chats[1].prompt_token_ids  # the file's own chat template
    assert chats[0].outputs[0].token_ids == chats[1].outputs[0].token_ids
    assert from_file.engine.max_model_len == from_dir.engine.max_model_len == 1024
    assert from_file.engine.eos_token_ids == from_dir.engine.eos_token_ids

    prepared = from_file.engine.model_path
    assert prepared.parent.parent == cache / "models"
    assert (prepared / GGUF_LINK).readlink() == file.resolve()  # a link, never a float32 copy
    assert not list(prepared.glob("*.safetensors"))
    stamp = (prepared / "config.json").stat().st_mtime_ns
    assert prepare_gguf(file) == prepared and (prepared / "config.json").stat().st_mtime_ns == stamp


def test_a_gguf_file_that_cannot_be_served_fails_at_start_naming_the_file(
    tiny_llama_gguf: Path, tmp_path: Path, cache: Path
) -> None:
    truncated = tmp_path / "truncated.gguf"
    data = (tiny_llama_gguf / "model.gguf").read_bytes()
    truncated.write_bytes(data[: len(data) - 4096])
    with pytest.raises(GGUFError, match=rf"{truncated}: tensor .* truncated"):
        LLM(str(truncated), **ENGINE)

    embedding = np.zeros((4, 32), dtype=np.float32)
    gpt2 = write_gguf(tmp_path / "gpt2.gguf", {"token_embd.weight": ("F32", embedding)}, arch="gpt2")
    with pytest.raises(GGUFError, match=rf"{gpt2}: architecture 'gpt2' is not supported"):
        LLM(str(gpt2), **ENGINE)

    with pytest.raises(FileNotFoundError, match=r"no such \.gguf file"):
        LLM(str(tmp_path / "missing.gguf"), **ENGINE)
    with pytest.raises(ValueError, match=r"is a \.gguf file, served with its weights in their GGUF types"):
        LLM(str(tiny_llama_gguf / "model.gguf"), quantization="none", **ENGINE)
    assert not (cache / "models" / "gguf").exists()  # nothing prepared for any of them
