"""``quantization="gguf"``: a tiny random Llama (and Qwen2) written as a GGUF file with mixed block types
against the float32 engine on the same weights de-quantized (``tests/support/gguf_files.gguf_model_dir``
writes both).

With the torch reference (de-quantize, then float32 matmul) and with the C++ kernels' float path (the
default ``gguf_kernel="float"``: weights de-quantized in registers) the two are the same model: same
tokens, logprobs to float32 rounding. With their int8 path, activations are quantized per 32 values, which
moves these tiny random models' logprobs by up to ~0.25 nats, and their top choices are often that
close (top-1 logprobs around -1.5 over 320 tokens): the outputs then agree until a near-tie, where float32's
own two candidates are within that margin. The default model's fidelity is tested on its real file
(``test_gguf_default_model.py``)."""

import itertools
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader

from kernels import AttentionMetadata, dispatch
from tests.engine.test_engine_parity import greedy, prompts
from tests.support.gguf_files import gguf_model_dir
from tests.support.reference import assert_pool_empty, chosen_logprobs
from tests.support.tiny_models import make_tiny_model
from worker.engine import LLM
from worker.engine.model.gguf_file import GGUFError
from worker.engine.model.gguf_layers import GGUFEmbedding, GGUFLinear
from worker.engine.model.gguf_loader import load_gguf_model
from worker.engine.model.model_config import ModelConfig
from worker.engine.outputs import CompletionOutput
from worker.main import engine_facts

TYPES = ["Q8_0", "Q4_K", "Q6_K", "Q4_0", "Q5_K", "Q4_1"]
SHAPES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def tiny_gguf(root: Path, arch: str = "llama", tied: bool = True, types: list[str] = TYPES) -> Path:
    src = make_tiny_model(root / "src", arch, tie_word_embeddings=tied, **SHAPES)
    return gguf_model_dir(src, root / "gguf", types, arch)


@pytest.fixture(scope="module")
def gguf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf_llama"))


NEAR_TIE = 0.3  # nats: how far the kernels' activation rounding moves these models' logprobs (above)


def generate_both(
    path: Path, count: int, kernel: str = "float"
) -> list[tuple[CompletionOutput, CompletionOutput]]:
    quantized = LLM(str(path), kv_cache_bytes=8 << 20, quantization="gguf", gguf_kernel=kernel)
    dense = LLM(str(path), kv_cache_bytes=8 << 20)
    texts = prompts(count, 3)
    got, want = quantized.generate(texts, greedy(5)), dense.generate(texts, greedy(5))
    assert_pool_empty(quantized)
    return [(a.outputs[0], b.outputs[0]) for a, b in zip(got, want, strict=True)]


@pytest.mark.parametrize("backend", ["torch", "auto"])
@pytest.mark.parametrize(("arch", "tied"), [("llama", True), ("llama", False), ("qwen2", False)])
def test_gguf_is_the_float32_model_under_the_reference_and_the_float_kernels(
    tmp_path: Path, arch: str, tied: bool, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names, shapes, llama.cpp's q/k row order, tying and Qwen2's biases are read right; the kernels'
    float path runs the same model."""
    monkeypatch.setenv(dispatch.BACKEND_ENV, backend)
    for got, want in generate_both(tiny_gguf(tmp_path, arch, tied), 4):
        assert got.token_ids == want.token_ids
        assert chosen_logprobs(got) == pytest.approx(chosen_logprobs(want), abs=1e-3)


def test_int8_kernels_follow_float32_until_a_near_tie(gguf_llama: Path) -> None:
    for got, want in generate_both(gguf_llama, 6, "int8"):
        pairs = zip(got.token_ids, want.token_ids, strict=True)
        same = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        end = len(got.token_ids) if same is None else same
        assert chosen_logprobs(got)[:end] == pytest.approx(chosen_logprobs(want)[:end], abs=NEAR_TIE)
        if same is not None:  # float32 ranked the kernels' choice within NEAR_TIE of its own
            float32_top = want.logprobs[same]
            chosen = float32_top.get(got.token_ids[same], -float("inf"))
            assert chosen >= float32_top[want.token_ids[same]] - NEAR_TIE, (
                same,
                got.logprobs[same],
                float32_top,
            )


def test_weights_stay_in_their_blocks(gguf_llama: Path) -> None:
    llm = LLM(str(gguf_llama), kv_cache_bytes=8 << 20, quantization="gguf")
    model = llm.engine.runner.model
    kinds = {type(m).__name__ for m in model.modules() if not list(m.children())}
    assert "Linear" not in kinds and "Embedding" not in kinds, kinds
    assert isinstance(model.embed_tokens, GGUFEmbedding) and isinstance(model.lm_head, GGUFLinear)
    assert model.lm_head.parts[0].data.data_ptr() == model.embed_tokens.table.data.data_ptr()  # tied
    floats = sum(p.numel() for p in model.parameters())
    assert floats == (2 * 2 + 1) * 256, "only the norms are float32 parameters"
    facts = engine_facts(llm.engine)  # the worker's ready line, and what its heartbeat publishes
    file = GGUFReader(gguf_llama / "model.gguf")
    assert facts["weights"]["types"] == Counter(t.tensor_type.name for t in file.tensors)
    assert set(facts["weights"]["types"]) == {*TYPES, "F32"}
    as_float32 = sum(int(t.n_elements) * 4 for t in file.tensors)
    # the blocks' bytes (tied: the table once), the norms' float32, nothing more
    assert facts["weights"]["bytes"] == sum(int(t.n_bytes) for t in file.tensors) < as_float32 / 3
    kernels = {"cpu": ["gguf-float-fma-scalar", "gguf-float-fma-avx2", "gguf-float-fma-avx512-vnni"]}
    assert facts["weights"]["kernels"] in kernels.get(facts["kernels"], ["gguf-torch-reference"])


def test_a_directory_without_a_gguf_file_says_so(tiny_llama: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"serves the one \.gguf file in .*found none"):
        LLM(str(tiny_llama), kv_cache_bytes=8 << 20, quantization="gguf")


def test_gguf_needs_float32_on_cpu(gguf_llama: Path) -> None:
    with pytest.raises(ValueError, match=r"quantization='gguf' runs .* on CPU with float32 activations"):
        LLM(str(gguf_llama), kv_cache_bytes=8 << 20, quantization="gguf", dtype="bfloat16")


def test_bad_files_fail_at_start_naming_the_tensor(gguf_llama: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(gguf_llama, tmp_path / "broken")
    data = (broken / "model.gguf").read_bytes()
    (broken / "model.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFError, match=r"tensor '.*' \(.*\).*truncated"):
        LLM(str(broken), kv_cache_bytes=8 << 20, quantization="gguf")
    (broken / "model.gguf").write_bytes(data.replace(b"llama", b"gpt2x", 1))
    with pytest.raises(GGUFError, match=r"architecture 'gpt2x' is not supported.*\['llama', 'qwen2'\]"):
        LLM(str(broken), kv_cache_bytes=8 << 20, quantization="gguf")
    other = tiny_gguf(tmp_path / "other")
    (broken / "model.gguf").write_bytes((other / "model.gguf").read_bytes())
    config = (broken / "config.json").read_text()
    (broken / "config.json").write_text(config.replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    with pytest.raises(GGUFError, match=r"no tensor 'blk\.2\.attn_q\.weight'"):
        LLM(str(broken), kv_cache_bytes=8 << 20, quantization="gguf")


def decode_step(model: torch.nn.Module, query_lens: list[int], context: int) -> tuple:
    """A step of sequences with ``context`` tokens cached and ``query_lens`` new ones each (random caches)."""
    config, block = model.config, 16
    per_seq = -(-(context + max(query_lens)) // block)
    shape = (len(query_lens) * per_seq + 1, block, config.num_kv_heads, config.head_dim)
    rng = torch.Generator().manual_seed(0)
    caches = [(torch.randn(shape, generator=rng), torch.randn(shape, generator=rng)) for _ in model.layers]
    tables = (
        (torch.randperm(len(query_lens) * per_seq, generator=rng) + 1).view(len(query_lens), per_seq).int()
    )
    positions = [p for n in query_lens for p in range(context, context + n)]
    rows = [b for b, n in enumerate(query_lens) for _ in range(n)]
    slots = [int(tables[b, p // block]) * block + p % block for b, p in zip(rows, positions, strict=True)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        query_start_loc=torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32),
        seq_lens=torch.tensor([context + n for n in query_lens], dtype=torch.int32),
        query_lens_cpu=query_lens,
        seq_lens_cpu=[context + n for n in query_lens],
        block_size=block,
    )
    ids = torch.randint(config.vocab_size, (len(positions),), generator=rng)
    return ids, torch.tensor(positions), caches, meta


@pytest.mark.parametrize("kernel", ["float", "int8"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_fused_layer_is_its_kernels_one_by_one_to_the_bit(tmp_path: Path, arch: str, kernel: str) -> None:
    """A GGUF model's decoder layers run in one C++ call each where every sequence attends in place: the
    same kernels in the same order, so the same hidden states, and the same K/V written to the cache."""
    if dispatch.backend_for(torch.device("cpu")) != "cpu":
        if os.environ.get("CI"):
            pytest.fail("the CPU kernels did not build")
        pytest.skip("the CPU kernels did not build")
    path = tiny_gguf(tmp_path, arch, tied=False)
    model = load_gguf_model(
        ModelConfig.from_pretrained(path), 128, path / "model.gguf", int8=kernel == "int8"
    )
    ids, positions, caches, meta = decode_step(model, [1, 1, 3, 1, 7], 40)
    assert all(
        layer.fused is not None and layer.fused.fits(torch.empty(11, 1), meta) for layer in model.layers
    )
    with torch.inference_mode():
        one_by_one_caches = [(k.clone(), v.clone()) for k, v in caches]
        fused = model(ids, positions, caches, meta)
        for layer in model.layers:
            layer.fused = None
        one_by_one = model(ids, positions, one_by_one_caches, meta)
    assert torch.equal(fused, one_by_one)
    assert all(
        torch.equal(a, b)
        for pair, other in zip(caches, one_by_one_caches, strict=True)
        for a, b in zip(pair, other, strict=True)
    )


def test_a_step_with_a_long_prefill_runs_layer_by_layer(gguf_llama: Path) -> None:
    """A prompt longer than in-place attention's reach gathers its K/V for SDPA in Python: no fused layer."""
    model = load_gguf_model(ModelConfig.from_pretrained(gguf_llama), 128, gguf_llama / "model.gguf")
    _, _, _, meta = decode_step(model, [1, 40], 20)
    assert not model.layers[0].fused.fits(torch.empty(41, 1), meta)


def test_a_layer_with_a_float_matrix_runs_module_by_module(tmp_path: Path) -> None:
    """F16 matrices beside quantized ones (the file's types taken in turn): a layer with any float part
    has no fused form; one whose parts are all quantized has."""
    path = tiny_gguf(tmp_path, types=["Q8_0", "Q8_0", "Q8_0", "F16"])
    model = load_gguf_model(ModelConfig.from_pretrained(path), 128, path / "model.gguf")
    for layer in model.layers:
        linears = [
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        ]
        assert (layer.fused is not None) == all(linear.quantized for linear in linears)
    assert {layer.fused is None for layer in model.layers} == {True}, "every layer has an F16 matrix here"
