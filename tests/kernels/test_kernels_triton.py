"""The Triton kernels against their torch references and a dense float64 attention.

Without a GPU they run under the Triton interpreter, at small shapes. The interpreter is chosen when
``@triton.jit`` decorates a function, for triton.language's own helpers too, and transformers
imports triton early; so ``TRITON_INTERPRET=1`` must be set before the test process starts, and
``tests/kernels/test_kernels_interpreted.py`` runs this module in a child process that has it, leaving the
rest of the suite untouched. On CUDA the same tests run compiled, and the ones marked ``gpu`` add
real shapes. Under ``CI=true`` a Triton that cannot be imported fails instead of skipping.
"""

import os
from pathlib import Path

import pytest
import torch

from kernels import AttentionMetadata, backend_for, dispatch, reference
from tests.kernels.test_kernels_reference import (
    KV_HEADS,
    dense_attention,
    make_meta,
    random_layer,
    scattered_tables,
)
from tests.support.reference import chosen_logprobs

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CUDA = torch.cuda.is_available()
try:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from kernels import triton_activation as t_activation
    from kernels import triton_paged_attention as t_attention
    from kernels import triton_rmsnorm as t_rmsnorm
    from kernels import triton_write_kv as t_write_kv
    from kernels.triton_common import check_runnable
except ImportError as error:  # a platform without a Triton wheel
    if CI:
        raise
    pytest.skip(f"triton is not importable: {error}", allow_module_level=True)

INTERPRETED = isinstance(t_write_kv._write_kv_kernel, InterpretedFunction)
if not CUDA and not INTERPRETED:
    pytest.skip(
        "no CUDA and TRITON_INTERPRET is not 1 (tests/kernels/test_kernels_interpreted.py runs this module with it)",  # noqa: E501
        allow_module_level=True,
    )
DEVICE = "cuda" if CUDA else "cpu"
# Two prompt chunks after cached prefixes (55 and 32 tokens) among three decodes, one of them a
# sequence's first token.
MIXED = [(1, 37), (20, 75), (1, 1), (13, 45), (1, 129)]
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def attention_case(batch, block_size, group, head_dim, dtype, device, seed=0):
    """Metadata, caches, query and the per-sequence dense K/V of a batch on scattered blocks."""
    gen = torch.Generator().manual_seed(seed)
    query_lens, seq_lens = zip(*batch, strict=True)
    tables, num_blocks = scattered_tables(seq_lens, block_size, gen)
    meta = make_meta(query_lens, seq_lens, tables, block_size)
    k_cache, v_cache, contexts = random_layer(tables, seq_lens, num_blocks, block_size, dtype, gen, head_dim)
    query = torch.randn(meta.num_tokens, KV_HEADS * group, head_dim, generator=gen).to(dtype)
    return to_device(meta, device), k_cache.to(device), v_cache.to(device), query.to(device), contexts


def to_device(meta: AttentionMetadata, device: str) -> AttentionMetadata:
    """The metadata as the model runner builds it: int32 lengths and tables on the device."""
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping.to(device),
        block_tables=meta.block_tables.to(device, torch.int32),
        query_start_loc=meta.query_start_loc.to(device, torch.int32),
        seq_lens=meta.seq_lens.to(device, torch.int32),
        query_lens_cpu=meta.query_lens_cpu,
        seq_lens_cpu=meta.seq_lens_cpu,
        block_size=meta.block_size,
    )


def assert_matches_dense(out, query, contexts, meta, scale, atol):
    starts = meta.query_starts_cpu
    for b, (k, v) in enumerate(contexts):
        want = dense_attention(query[starts[b] : starts[b + 1]].cpu(), k, v, scale)
        got = out[starts[b] : starts[b + 1]].cpu().double()
        torch.testing.assert_close(got, want, atol=atol, rtol=atol, msg=f"sequence {b}")


TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # vs dense float64
# Elementwise kernels vs their references: a unit in the last place per rounding, at most two (the
# interpreter truncates float32 -> bfloat16 where GPUs and torch round to nearest even).
ROUNDING = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def check_attention(batch, block_size, group, head_dim, dtype, device, num_splits=None, tile_n=32):
    meta, k_cache, v_cache, query, contexts = attention_case(
        batch, block_size, group, head_dim, dtype, device
    )
    scale = head_dim**-0.5
    out = t_attention.paged_attention(query, k_cache, v_cache, meta, scale, num_splits, tile_n)
    assert out.dtype == dtype and out.shape == query.shape
    assert_matches_dense(out, query, contexts, meta, scale, TOLERANCE[dtype])
    return out


# --- small shapes: under the interpreter without a GPU ---


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_mixed_batch_matches_dense(block_size, group, head_dim, dtype):
    check_attention(MIXED, block_size, group, head_dim, dtype, DEVICE)


def test_attention_in_float16():
    check_attention(MIXED, 16, 4, 64, torch.float16, DEVICE)


def test_attention_whole_prompt_and_head_dim_not_a_power_of_two():
    check_attention([*MIXED[:2], (9, 9)], 16, 2, 80, torch.float32, DEVICE)


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_k_decode_equals_unsplit(num_splits):
    """Decode-only: 5 splits leave the 1- and 9-token sequences with empty splits."""
    batch = [(1, 300), (1, 9), (1, 64), (1, 1)]
    whole = check_attention(batch, 16, 4, 64, torch.float32, DEVICE, num_splits=1, tile_n=16)
    split = check_attention(batch, 16, 4, 64, torch.float32, DEVICE, num_splits=num_splits, tile_n=16)
    torch.testing.assert_close(split, whole, atol=1e-6, rtol=1e-6)


def test_split_k_in_a_mixed_batch():
    check_attention(MIXED, 16, 4, 64, torch.float32, DEVICE, num_splits=3, tile_n=16)


def test_split_count_fills_the_gpu_only_for_few_long_decodes(monkeypatch):
    monkeypatch.setattr(t_attention, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")

    def splits(num_seqs, seq_len, kv_heads=8):
        meta = make_meta([1] * num_seqs, [seq_len] * num_seqs, [[1] * -(-seq_len // 16)] * num_seqs, 16)
        return t_attention.num_kv_splits(meta, kv_heads, cuda)

    assert splits(1, 8192) == 16  # 8 programs on 132 SMs; capped at MAX_SPLITS
    assert splits(4, 2048) == 4  # >= MIN_SPLIT_KEYS keys each
    assert splits(64, 8192) == 1  # 512 programs already fill the GPU
    assert splits(1, 300) == 1
    assert t_attention.num_kv_splits(make_meta([1], [8192], [[1] * 512], 16), 8, torch.device("cpu")) == 1


def test_write_kv_matches_reference_and_skips_padding():
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache = (torch.randn(6, 16, 3, 64, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
    # Key and value as the model makes them: views into one fused qkv row.
    qkv = torch.randn(5, 9, 64, generator=gen).to(DEVICE, torch.bfloat16)
    key, value = qkv[:, 3:6], qkv[:, 6:9]
    slots = torch.tensor([13, 2, 95, 40, -1], device=DEVICE)  # -1: a padding token, not written
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(key[:4], value[:4], want_k, want_v, slots[:4])

    t_write_kv.write_kv(key, value, k_cache, v_cache, slots)

    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize(("hidden", "dtype"), [(96, torch.float32), (256, torch.bfloat16)])
def test_rms_norm_and_fused_add_match_reference(hidden, dtype):
    gen = torch.Generator().manual_seed(3)
    x, residual = (torch.randn(7, hidden, generator=gen).to(DEVICE, dtype) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(DEVICE, dtype)
    close = {"atol": ROUNDING[dtype], "rtol": ROUNDING[dtype]}

    torch.testing.assert_close(
        t_rmsnorm.rms_norm(x, weight, 1e-6), reference.rms_norm(x, weight, 1e-6), **close
    )
    out, total = t_rmsnorm.add_rms_norm(x, residual, weight, 1e-6)
    want_out, want_total = reference.add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(total, want_total, **(close if INTERPRETED else {"atol": 0, "rtol": 0}))
    torch.testing.assert_close(out, want_out, **close)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_matches_reference(dtype):
    x = torch.randn(3, 2 * 1100, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)  # 2 blocks
    close = {"atol": ROUNDING[dtype], "rtol": ROUNDING[dtype]}
    torch.testing.assert_close(t_activation.silu_and_mul(x), reference.silu_and_mul(x), **close)


def test_dispatch_follows_the_device_and_the_switch(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(dispatch.BACKEND_ENV, raising=False)
    assert backend_for(cuda) == "triton"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "torch")
    assert backend_for(cuda) == "torch"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "triton")
    assert backend_for(cpu) == "triton"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match="PAGEDQ_KERNEL_BACKEND"):
        backend_for(cpu)


def _kernel(x_ptr):
    pass


def test_triton_on_cpu_tensors_without_the_interpreter_says_how_to_run_it():
    check_runnable(InterpretedFunction(_kernel), torch.zeros(1))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        check_runnable(JITFunction(_kernel), torch.zeros(1))


def test_engine_through_the_triton_kernels_matches_the_reference(monkeypatch, tiny_llama: Path):
    """The whole model (RMSNorm, fused add, KV writes, attention, SiLU*mul) through the interface:
    a prompt batch, chunked prefill behind a cached prefix, then decodes."""
    from worker.engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
    prompts = ["Paged attention stores keys and values", "The quick brown fox jumps over the lazy dog."]
    runs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(dispatch.BACKEND_ENV, backend)
        llm = LLM(str(tiny_llama), kv_cache_bytes=1 << 20, max_num_batched_tokens=16, block_size=16)
        runs[backend] = [out.outputs[0] for out in llm.generate(prompts, params)]
    for want, got in zip(runs["torch"], runs["triton"], strict=True):
        assert got.token_ids == want.token_ids
        assert chosen_logprobs(got) == pytest.approx(chosen_logprobs(want), abs=1e-4)


# --- on a GPU, at real shapes ---

# Contexts up to 2k over 2 kv heads: many decodes of assorted lengths, two long prefill chunks.
REAL_MIXED = [(1, 1500), (512, 1024), *[(1, 200 + 37 * i) for i in range(60)], (300, 2048), (1, 1)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize(
    ("head_dim", "dtype"), [(128, torch.bfloat16), (64, torch.float16), (128, torch.float32)]
)
def test_gpu_attention_mixed_batch(block_size, group, head_dim, dtype):
    check_attention(REAL_MIXED, block_size, group, head_dim, dtype, "cuda", tile_n=None)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_split_k_decode_equals_unsplit(dtype):
    batch = [(1, 8000), (1, 3000), (1, 17)]
    whole = check_attention(batch, 16, 4, 128, dtype, "cuda", num_splits=1, tile_n=None)
    split = check_attention(batch, 16, 4, 128, dtype, "cuda", tile_n=None)  # the policy's split count
    torch.testing.assert_close(split.float(), whole.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.gpu
@gpu
def test_gpu_write_kv_and_fused_ops_match_reference():
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache = (
        torch.randn(64, 16, 8, 128, generator=gen).to("cuda", torch.bfloat16) for _ in range(2)
    )
    key, value = (torch.randn(300, 8, 128, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    slots = torch.randperm(64 * 16, generator=gen)[:300].cuda()
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, want_k, want_v, slots)
    t_write_kv.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)

    x, residual = (torch.randn(300, 4096, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    weight = torch.randn(4096, generator=gen).to("cuda", torch.bfloat16)
    out, total = t_rmsnorm.add_rms_norm(x, residual, weight, 1e-5)
    want_out, want_total = reference.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(out, want_out, atol=2e-2, rtol=2e-2)
    gate_up = torch.randn(300, 2 * 14336, generator=gen).to("cuda", torch.bfloat16)
    torch.testing.assert_close(
        t_activation.silu_and_mul(gate_up), reference.silu_and_mul(gate_up), atol=2e-2, rtol=2e-2
    )


@pytest.mark.gpu
@gpu
def test_gpu_cuda_graphs_give_the_eager_tokens(tiny_llama: Path):
    from worker.engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = [f"{i} Paged attention stores keys and values" for i in range(11)]
    # A KV budget of its own: the first engine still holds its memory when the second profiles what is free.
    engines = (LLM(str(tiny_llama), enforce_eager=eager, kv_cache_bytes=16 << 20) for eager in (True, False))
    runs = [[o.outputs[0].token_ids for o in llm.generate(prompts, params)] for llm in engines]
    assert runs[0] == runs[1]
