"""The torch reference kernels against a naive dense attention (tests/kernels/test_kernels_cpu.py runs the
same checks on the CPU kernels)."""

import math

import pytest
import torch

import kernels.metadata
from kernels import AttentionMetadata, copy_blocks, dispatch, paged_attention, write_kv

pytestmark = pytest.mark.fast

HEAD_DIM = 32
KV_HEADS = 2
# (query_len, seq_len): decodes of assorted lengths (1, a block multiple, several blocks)
# interleaved with a whole prompt and a prompt chunk after a 55-token cached prefix.
MIXED = [(1, 37), (50, 50), (1, 1), (20, 75), (1, 64), (1, 129), (33, 33), (1, 5)]


@pytest.fixture(autouse=True)
def torch_reference(monkeypatch):
    monkeypatch.setenv(dispatch.BACKEND_ENV, "torch")


def make_meta(query_lens, seq_lens, tables, block_size) -> AttentionMetadata:
    """Metadata for sequences whose blocks are ``tables[b]`` (lists of block ids)."""
    width = max(len(t) for t in tables) + 1  # a spare column of 0-padding
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slots = [
        tables[b][p // block_size] * block_size + p % block_size
        for b, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True))
        for p in range(s - q, s)
    ]
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=block_tables,
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()]),
        seq_lens=torch.tensor(seq_lens),
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=list(seq_lens),
        block_size=block_size,
    )


def scattered_tables(seq_lens, block_size, gen) -> tuple[list[list[int]], int]:
    """Each sequence's blocks drawn from a shuffled pool (never block 0, the padding id)."""
    counts = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = sum(counts) + 4
    pool = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables, used = [], 0
    for c in counts:
        tables.append(pool[used : used + c])
        used += c
    return tables, num_blocks


def dense_attention(q, k, v, scale) -> torch.Tensor:
    """q [L, H, D] at the last L positions of k/v [S, KV, D]; float64, causal."""
    num_q, num_k = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(group, dim=1).transpose(0, 1) for x in (k, v))
    scores = q.double().transpose(0, 1) @ k.transpose(1, 2) * scale
    q_pos = torch.arange(num_k - num_q, num_k)[:, None]
    scores = scores.masked_fill(torch.arange(num_k)[None, :] > q_pos, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)


def random_layer(tables, seq_lens, num_blocks, block_size, dtype, gen, head_dim=HEAD_DIM):
    """Caches holding each sequence's random K/V at its scattered slots, and that K/V densely."""
    # Unused slots hold large garbage, so reading an unmasked stray key would show.
    k_cache, v_cache = (
        (100 * torch.randn(num_blocks, block_size, KV_HEADS, head_dim, generator=gen)).to(dtype)
        for _ in range(2)
    )
    contexts = []
    for table, s in zip(tables, seq_lens, strict=True):
        k, v = (torch.randn(s, KV_HEADS, head_dim, generator=gen).to(dtype) for _ in range(2))
        positions = torch.arange(s)
        blocks = torch.tensor(table)[positions // block_size]
        k_cache[blocks, positions % block_size] = k
        v_cache[blocks, positions % block_size] = v
        contexts.append((k, v))
    return k_cache, v_cache, contexts


def check_mixed_batch(batch, block_size, group, dtype, atol):
    gen = torch.Generator().manual_seed(block_size * 10 + group)
    query_lens, seq_lens = zip(*batch, strict=True)
    tables, num_blocks = scattered_tables(seq_lens, block_size, gen)
    meta = make_meta(query_lens, seq_lens, tables, block_size)
    starts, scale = meta.query_start_loc.tolist(), HEAD_DIM**-0.5
    for _layer in range(2):  # like a model's layers: one metadata (and its cached plans), two caches
        k_cache, v_cache, contexts = random_layer(tables, seq_lens, num_blocks, block_size, dtype, gen)
        query = torch.randn(meta.num_tokens, KV_HEADS * group, HEAD_DIM, generator=gen).to(dtype)

        out = paged_attention(query, k_cache, v_cache, meta, scale)

        assert out.dtype == dtype and out.shape == query.shape
        for b, (k, v) in enumerate(contexts):
            want = dense_attention(query[starts[b] : starts[b + 1]], k, v, scale)
            torch.testing.assert_close(out[starts[b] : starts[b + 1]].double(), want, atol=atol, rtol=atol)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_paged_attention_mixed_batch(block_size, group, dtype, atol):
    check_mixed_batch(MIXED, block_size, group, dtype, atol)


@pytest.mark.parametrize("budget", [1, 100])
def test_paged_attention_decodes_in_several_chunks(monkeypatch, budget):
    monkeypatch.setattr(kernels.metadata, "DECODE_CHUNK_TOKENS", budget)
    decodes = [(1, s) for s in (3, 200, 17, 16, 90, 1, 33, 64, 65)]
    check_mixed_batch([*decodes, (20, 75)], 16, 3, torch.float32, 1e-5)


def test_prefill_then_decode_through_write_kv():
    """The engine's flow: write the new tokens' K/V, then attend; a prompt, then one more token."""
    gen = torch.Generator().manual_seed(1)
    block_size, table, scale = 16, [[5, 2, 7]], 0.3
    k_cache, v_cache = (torch.zeros(8, block_size, KV_HEADS, HEAD_DIM) for _ in range(2))
    k, v = (torch.randn(41, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    query = torch.randn(41, 2 * KV_HEADS, HEAD_DIM, generator=gen)
    for lo, hi in [(0, 40), (40, 41)]:
        meta = make_meta([hi - lo], [hi], table, block_size)
        write_kv(k[lo:hi], v[lo:hi], k_cache, v_cache, meta.slot_mapping)
        out = paged_attention(query[lo:hi], k_cache, v_cache, meta, scale)
        want = dense_attention(query[lo:hi], k[:hi], v[:hi], scale)
        torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_metadata_plans_are_computed_once():
    meta = make_meta([1, 4], [9, 4], [[1], [2]], 16)
    assert meta.decode_chunks is meta.decode_chunks
    assert meta.prefills is meta.prefills
    assert [p.start for p in meta.prefills] == [1]


def test_write_kv_stores_each_token_at_its_slot():
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache = (torch.randn(6, 4, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    before_k, before_v = k_cache.clone(), v_cache.clone()
    key, value = (torch.randn(5, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    slots = torch.tensor([13, 2, 23, 0, 9])

    write_kv(key, value, k_cache, v_cache, slots)

    for cache, before, new in [(k_cache, before_k, key), (v_cache, before_v, value)]:
        flat, expected = cache.view(24, KV_HEADS, HEAD_DIM), before.view(24, KV_HEADS, HEAD_DIM).clone()
        expected[slots] = new
        assert torch.equal(flat, expected)
        assert not torch.equal(flat[slots], before.view(24, KV_HEADS, HEAD_DIM)[slots])


def test_copy_blocks_copies_exactly_the_named_blocks():
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = (torch.randn(8, 4, KV_HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    before_k, before_v = k_cache.clone(), v_cache.clone()

    copy_blocks(k_cache, v_cache, torch.tensor([[1, 6], [4, 0], [1, 3]]))

    for cache, before in [(k_cache, before_k), (v_cache, before_v)]:
        expected = before.clone()
        expected[[6, 0, 3]] = before[[1, 4, 1]]
        assert torch.equal(cache, expected)


def test_bad_inputs_raise_value_error():
    meta = make_meta([2], [5], [[1]], 16)
    cache = torch.zeros(4, 16, KV_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="query"):
        paged_attention(torch.zeros(3, 2, HEAD_DIM), cache, cache, meta, 1.0)
    with pytest.raises(ValueError, match="block_size 16"):
        paged_attention(torch.zeros(2, 2, HEAD_DIM), cache[:, :8], cache[:, :8], meta, 1.0)
    with pytest.raises(ValueError, match="query_len <= seq_len"):
        make_meta([6], [5], [[1]], 16)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(
            torch.zeros(2, KV_HEADS, HEAD_DIM),
            torch.zeros(2, KV_HEADS, HEAD_DIM),
            cache,
            cache,
            torch.tensor([0]),
        )


def test_encoder_attention_attends_each_input_over_its_own_tokens():
    generator = torch.Generator().manual_seed(8)
    heads, lens = 3, [6, 6, 1, 11, 2]
    qkv = torch.randn(sum(lens), 3 * heads * HEAD_DIM, generator=generator, dtype=torch.float64)
    got = dispatch.encoder_attention(qkv, lens, heads)
    start = 0
    for n in lens:
        q, k, v = qkv[start : start + n].view(n, 3, heads, HEAD_DIM).unbind(1)
        weights = torch.einsum("qhd,khd->hqk", q, k).div(math.sqrt(HEAD_DIM)).softmax(-1)
        want = torch.einsum("hqk,khd->qhd", weights, v).reshape(n, -1)
        torch.testing.assert_close(got[start : start + n], want)
        start += n
