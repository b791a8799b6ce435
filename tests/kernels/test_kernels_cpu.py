"""The C++ CPU kernels (kernels/cpu_kernels.cpp) against the torch reference and a dense float64
attention. The first run on a machine builds them (~15-30 s on 2 cores; cached in ~/.cache/pagedq).
Under ``CI=true`` a build failure fails here instead of skipping."""

import dataclasses
import logging
import os
import subprocess
import sys
import threading

import pytest
import torch

import kernels.cpu
from kernels import dispatch, reference
from tests.kernels.test_kernels_reference import MIXED, check_mixed_batch, make_meta, scattered_tables

ROUNDING = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def cpu_backend(monkeypatch):
    if not kernels.cpu.available():
        if os.environ.get("CI"):
            pytest.fail("the CPU kernels did not build; see the warning in the log")
        pytest.skip("the CPU kernels did not build")
    monkeypatch.setenv(dispatch.BACKEND_ENV, "cpu")


def test_dispatch_picks_the_cpu_kernels_for_cpu_tensors_by_default(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dispatch.backend_for(cpu) == "cpu"
    assert dispatch.backend_for(cuda) == "torch"  # the CPU kernels never take a GPU tensor
    monkeypatch.delenv(dispatch.BACKEND_ENV)
    assert dispatch.backend_for(cpu) == "cpu"
    assert dispatch.backend_for(cuda) == "triton"
    monkeypatch.setenv(dispatch.BACKEND_ENV, "torch")
    assert dispatch.backend_for(cpu) == "torch"


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_paged_attention_mixed_batch(block_size, group, dtype):
    check_mixed_batch(MIXED, block_size, group, dtype, ROUNDING[dtype])


def test_paged_attention_accepts_a_strided_query():
    """The model passes q as a view into the fused qkv projection's output."""
    check = torch.Generator().manual_seed(5)
    meta_args = ([1, 3], [20, 3], [[2, 1], [3]], 16)
    from tests.kernels.test_kernels_reference import make_meta

    meta = make_meta(*meta_args)
    k_cache, v_cache = (torch.randn(4, 16, 2, 32, generator=check) for _ in range(2))
    qkv = torch.randn(4, 6, 32, generator=check)
    query = qkv[:, :4]
    got = dispatch.paged_attention(query, k_cache, v_cache, meta, 0.2)
    want = reference.paged_attention(query, k_cache, v_cache, meta, 0.2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def attend_in_chunks(query, k_cache, v_cache, table, chunk, start=0) -> torch.Tensor:
    """Rows ``start`` onwards of one sequence (``query`` holds all its rows), ``chunk`` at a time after
    ``start`` cached keys, as the engine's chunked prefill (chunk 1: decode steps) calls the kernel."""
    pieces = []
    for lo in range(start, query.shape[0], chunk):
        hi = min(lo + chunk, query.shape[0])
        meta = dataclasses.replace(
            make_meta([hi - lo], [hi], [table], k_cache.shape[1]), batch_invariant=True
        )
        pieces.append(dispatch.paged_attention(query[lo:hi], k_cache, v_cache, meta, 0.125))
    return torch.cat(pieces)


@pytest.mark.parametrize(
    ("dtype", "group", "dim"),
    [(torch.float32, 3, 64), (torch.bfloat16, 3, 64), (torch.float32, 2, 40), (torch.float32, 5, 32)],
)
def test_prefill_chunks_attend_as_decodes_do(dtype, group, dim):
    """A position's attention is the same bits whichever chunk (and tile of rows) computes it, across
    block boundaries and partial blocks: the batch-invariant engine's chunked prefill relies on it."""
    gen = torch.Generator().manual_seed(11)
    length, block_size, kv_heads = 600, 16, 2
    tables, num_blocks = scattered_tables([length], block_size, gen)
    k_cache, v_cache = (
        torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(dtype) for _ in range(2)
    )
    query = torch.randn(length, kv_heads * group, dim, generator=gen).to(dtype)
    decodes = attend_in_chunks(query, k_cache, v_cache, tables[0], 1, start=3)
    for chunk in (7, 64, 512):
        chunked = attend_in_chunks(query, k_cache, v_cache, tables[0], chunk, start=3)
        assert torch.equal(chunked, decodes), f"chunks of {chunk}"
    meta = make_meta([length], [length], tables, block_size)
    want = reference.paged_attention(query, k_cache, v_cache, meta, 0.125)[3:]
    torch.testing.assert_close(decodes, want, atol=ROUNDING[dtype], rtol=ROUNDING[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_elementwise_kernels_match_the_reference(dtype):
    gen = torch.Generator().manual_seed(6)
    x, residual = (torch.randn(5, 96, generator=gen).to(dtype) for _ in range(2))
    weight = torch.rand(96, generator=gen).to(dtype) + 0.5
    close = {"atol": ROUNDING[dtype], "rtol": ROUNDING[dtype]}

    normed, total = dispatch.add_rms_norm(x, residual, weight, 1e-5)
    want_normed, want_total = reference.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(normed, want_normed, **close)

    gate_up = torch.randn(5, 2 * 70, generator=gen).to(dtype)
    torch.testing.assert_close(dispatch.silu_and_mul(gate_up), reference.silu_and_mul(gate_up), **close)

    qk = torch.randn(5, 7, 32, generator=gen).to(dtype)[:, 1:6]  # strided, as a view of qkv's output
    cos, sin = (torch.randn(5, 1, 32, generator=gen).to(dtype) for _ in range(2))
    want = reference.rotate(qk, cos, sin)
    assert dispatch.rotate(qk, cos, sin) is qk  # in place
    torch.testing.assert_close(qk, want, **close)


def test_a_failed_build_falls_back_to_the_reference_and_says_so_once(monkeypatch, tmp_path, caplog):
    kernels.cpu.available.cache_clear()
    monkeypatch.setattr(kernels.cpu, "SOURCES", [tmp_path / "broken.cpp"])
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    monkeypatch.setenv(kernels.cpu.DIR_ENV, str(tmp_path / "build"))
    try:
        with caplog.at_level(logging.WARNING, logger="pagedq.kernels"):
            assert dispatch.backend_for(torch.device("cpu")) == "torch"
            assert dispatch.backend_for(torch.device("cpu")) == "torch"
        assert [r.message.startswith("CPU kernels unavailable") for r in caplog.records] == [True]
    finally:
        kernels.cpu.available.cache_clear()


BUILD_ONE = """
import sys
from pathlib import Path
import kernels.cpu
kernels.cpu.SOURCES = [Path(sys.argv[1])]
assert kernels.cpu.available()
print(next(kernels.cpu.build_dir().glob("*.so")).stat().st_mtime_ns)
"""


def test_two_checkouts_of_the_same_source_share_one_build(tmp_path):
    """ninja records a source's absolute path: each checkout compiling its own file rebuilt the other's
    build at its first use in every process."""
    env = {**os.environ, kernels.cpu.DIR_ENV: str(tmp_path / "build")}
    built = []
    for checkout in ("a", "b", "a"):
        source = tmp_path / checkout / "probe.cpp"
        source.parent.mkdir(exist_ok=True)
        source.write_text("int pagedq_probe() { return 1; }\n")
        command = [sys.executable, "-c", BUILD_ONE, str(source)]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        built.append(int(run.stdout.split()[-1]))
    assert built[0] == built[1] == built[2]  # built once, by the first


@pytest.mark.parametrize("in_place_max_query", [1, 10**6])
def test_prefills_in_place_or_through_sdpa(monkeypatch, in_place_max_query):
    """Only decodes in the kernel (long prefills via SDPA), or every sequence in the kernel."""
    monkeypatch.setattr(kernels.cpu, "IN_PLACE_MAX_QUERY", in_place_max_query)
    check_mixed_batch(MIXED, 16, 3, torch.float32, ROUNDING[torch.float32])


def test_a_lock_left_by_a_killed_build_does_not_block_the_next():
    """cpp_extension's lock file, left behind by a build that died, would make every later load wait."""
    (kernels.cpu.build_dir() / "lock").touch()
    kernels.cpu.available.cache_clear()
    loader = threading.Thread(target=kernels.cpu.available, daemon=True)
    loader.start()
    loader.join(120)
    assert not loader.is_alive() and kernels.cpu.available()


@pytest.mark.parametrize(("k", "n", "bias"), [(64, 96, False), (37, 70, True), (576, 130, False)])
def test_invariant_linear_rows_do_not_depend_on_their_batch(k, n, bias):
    """Within float32 rounding of ``F.linear``, and each row the same bits in any batch it is part of (K
    not a multiple of 16 exercises the tail; 130 rows cross a 64-row block)."""
    gen = torch.Generator().manual_seed(k)
    x, w = torch.randn(130, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    out = kernels.cpu.invariant_linear(x, w, b)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-4)
    for rows in (slice(0, 1), slice(5, 6), slice(3, 10), slice(60, 130), slice(127, 130)):
        assert torch.equal(kernels.cpu.invariant_linear(x[rows], w, b), out[rows])


@pytest.mark.parametrize(("k", "n", "bias"), [(64, 96, True), (576, 130, False), (1536, 24, True)])
def test_the_packed_invariant_linear_gives_the_unpacked_kernels_bits(k, n, bias):
    """The AVX2 kernel on packed weights (the default where AVX2 is the widest; run here on any AVX2 CPU)
    against ``invariant_linear`` (AVX-512 where the CPU has it): the same bits for every row, alone or in
    any batch (130 rows: a partial 4-row tile and two 64-row blocks; 130 columns: a partial panel)."""
    gen = torch.Generator().manual_seed(k + n)
    x, w = torch.randn(130, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    packed = torch.ops.pagedq_cpu.pack_invariant_linear(w)
    out = kernels.cpu.invariant_linear_packed(x, packed, n, b)
    assert torch.equal(out, kernels.cpu.invariant_linear(x, w, b))
    for rows in (slice(0, 1), slice(5, 7), slice(3, 10), slice(60, 130), slice(127, 130)):
        assert torch.equal(kernels.cpu.invariant_linear_packed(x[rows], packed, n, b), out[rows])
    assert torch.equal(
        kernels.cpu.invariant_linear_packed(x.view(2, 65, k), packed, n, b), out.view(2, 65, n)
    )


def test_weights_are_packed_only_where_the_packed_kernel_runs_and_k_allows():
    w = torch.randn(40, 64)
    packed = kernels.cpu.pack_invariant_linear(w)
    assert (packed is not None) == torch.ops.pagedq_cpu.packs_invariant_linear()
    assert kernels.cpu.pack_invariant_linear(torch.randn(40, 37)) is None  # K not a multiple of 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "dim"), [(12, 32), (3, 20)])  # the unrolled and the generic loops
def test_encoder_attention_matches_the_reference_and_ignores_the_other_inputs(dtype, heads, dim):
    generator = torch.Generator().manual_seed(7)
    lens = [9, 9, 4, 1, 130, 2, 2, 3]  # runs of equal lengths, a one-token input, query groups' tails
    qkv = torch.randn(sum(lens), 3 * heads * dim, generator=generator).to(dtype)
    got = dispatch.encoder_attention(qkv, lens, heads)
    want = reference.encoder_attention(qkv.double(), lens, heads).to(dtype)
    torch.testing.assert_close(got, want, atol=ROUNDING[dtype], rtol=ROUNDING[dtype])
    first = sum(lens[:4])
    alone = dispatch.encoder_attention(qkv[first : first + 130], [130], heads)
    assert torch.equal(alone, got[first : first + 130])  # bit for bit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_stores_what_the_reference_does_from_strided_rows(dtype):
    """Key and value are strided views, each its own way, as the model hands them over: the key rotated
    out of the projection's output, the value still in it."""
    gen = torch.Generator().manual_seed(3)
    blocks, block_size, heads, dim, tokens = 9, 16, 3, 64, 37
    qkv = torch.randn(tokens, 6 * heads * dim, generator=gen).to(dtype)
    key = qkv[:, 4 * heads * dim : 5 * heads * dim].reshape(tokens, heads, dim).contiguous()
    value = qkv[:, 5 * heads * dim :].view(tokens, heads, dim)
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens]
    caches = [torch.randn(blocks, block_size, heads, dim, generator=gen).to(dtype) for _ in range(2)]
    want = [cache.clone() for cache in caches]
    reference.write_kv(key, value, *want, slots)
    dispatch.write_kv(key, value, *caches, slots)
    assert all(torch.equal(cache, wanted) for cache, wanted in zip(caches, want, strict=True))
    transposed = value.transpose(0, 1).contiguous().transpose(0, 1)  # heads apart: copied to rows first
    dispatch.write_kv(key, transposed, *caches, slots.flip(0))
    reference.write_kv(key, transposed, *want, slots.flip(0))
    assert all(torch.equal(cache, wanted) for cache, wanted in zip(caches, want, strict=True))
    with pytest.raises(RuntimeError, match="slot out of the cache"):  # the C++ kernel's own check
        dispatch.write_kv(key, value, *caches, torch.full_like(slots, blocks * block_size))
