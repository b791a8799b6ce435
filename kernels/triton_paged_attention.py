"""Paged attention in Triton: prefill chunks and decodes of one flattened batch in one launch.

One program attends BLOCK_Q query tokens of one sequence for one kv head: its BLOCK_M rows are
those tokens x the GROUP query heads that share the kv head (padded to HEADS_P), so each K/V tile
is loaded once for all of them (GQA). K/V tiles of TILE_N keys are gathered through the block
table, key n living at slot ``table[n // BLOCK_SIZE] * BLOCK_SIZE + n % BLOCK_SIZE``; softmax is
online (running max and sum, exp2). Query token i of a sequence with q new tokens out of s sits
at position s - q + i and sees keys 0 .. s - q + i.

Split-K: with NUM_SPLITS > 1 each program covers one slice of the keys and writes its unnormalised
output with its max and sum; ``_reduce_splits_kernel`` combines them. The engine splits only
decode-only steps with few sequences and long contexts, where one program per (sequence, kv head)
would leave most of the GPU idle.

Programs are numbered by query block: sequence b's blocks start at
``query_start_loc[b] // BLOCK_Q + b`` (an upper bound that needs no per-step host work), found by a
binary search; programs past a sequence's last block exit at once. Decode-only steps skip the
search (program b is sequence b).
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.metadata import AttentionMetadata
from kernels.reference import check_attention_shapes
from kernels.triton_common import check_runnable, pow2

# Tile sizes: the largest that compile without register spills for sm_80 and sm_90 at head_dim 128
# (tests/test_kernels_compile.py checks them), 4 warps for decodes and 8 when prefills run.
PREFILL_BLOCK_M = 64  # query rows (tokens x heads of a group) per program when any prefill runs
DECODE_BLOCK_M = 16  # tl.dot needs >= 16 rows; a decode has only GROUP real ones
TILE_N = 64  # keys per K/V tile; 32 in float32
MAX_SPLITS = 16
MIN_SPLIT_KEYS = 512  # a split shorter than this costs more in its reduce than it saves
LOG2E = 1.4426950408889634


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, m_ptr, l_ptr,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    num_seqs, scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_bt,
    GROUP: tl.constexpr, HEADS_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DECODE_ONLY: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if DECODE_ONLY:
        seq = pid
        q_block = 0
    else:
        lo = 0
        hi = num_seqs
        while lo < hi:  # the last sequence whose first block is <= pid
            mid = (lo + hi) // 2
            if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid:
                lo = mid + 1
            else:
                hi = mid
        seq = lo - 1
        q_block = pid - (tl.load(query_start_loc_ptr + seq) // BLOCK_Q + seq)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    ctx_len = tl.load(seq_lens_ptr + seq) - q_len  # cached tokens before the first new one

    rows = tl.arange(0, BLOCK_M)
    tok = q_block * BLOCK_Q + rows // HEADS_P  # new-token index within the sequence
    head = kv_head * GROUP + rows % HEADS_P
    row_ok = (rows < BLOCK_Q * HEADS_P) & (tok < q_len) & (rows % HEADS_P < GROUP)
    dims = tl.arange(0, DIM_P)
    dim_ok = dims < HEAD_DIM
    token = (q_start + tok).to(tl.int64)
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :], mask=q_mask)
    if UPCAST:  # the interpreter keeps bfloat16 as raw bits and cannot multiply it
        q = q.to(tl.float32)

    kv_end = ctx_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)  # keys this block's last token sees
    kv_lo = 0
    kv_hi = kv_end
    if NUM_SPLITS > 1:
        chunk = tl.cdiv(tl.cdiv(kv_end, NUM_SPLITS), TILE_N) * TILE_N
        kv_lo = split * chunk
        kv_hi = tl.minimum(kv_lo + chunk, kv_end)

    # A finite floor, not -inf: a row with no key in this tile (or split) keeps exp2(m_i - m_new) = 1.
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_P], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(kv_lo, kv_hi, TILE_N):
        n = start + tl.arange(0, TILE_N)
        n_ok = n < kv_hi
        block = tl.load(bt_row + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
        kv_off = block * stride_kb + (n % BLOCK_SIZE) * stride_ks + kv_head * stride_kh
        kv_mask = n_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_ptr + kv_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        visible = n_ok[None, :] & (n[None, :] <= ctx_len + tok[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    out_off = token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + out_off, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:  # partials [T, H, NUM_SPLITS, DIM_P] and [T, H, NUM_SPLITS]
        tl.store(out_ptr + out_off + split * DIM_P, acc, mask=q_mask)
        stat = (token * (GROUP * tl.num_programs(1)) + head) * NUM_SPLITS + split
        tl.store(m_ptr + stat, m_i, mask=row_ok)
        tl.store(l_ptr + stat, l_i, mask=row_ok)


@triton.jit
def _reduce_splits_kernel(
    acc_ptr, m_ptr, l_ptr, out_ptr, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    first = (token * tl.num_programs(1) + head) * NUM_SPLITS
    splits = tl.arange(0, SPLITS_P)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, DIM_P)
    m = tl.load(m_ptr + first + splits, mask=split_ok, other=-1.0e30)
    l_s = tl.load(l_ptr + first + splits, mask=split_ok, other=0.0)
    acc_mask = split_ok[:, None] & (dims[None, :] < HEAD_DIM)
    acc = tl.load(acc_ptr + (first + splits)[:, None] * DIM_P + dims[None, :], mask=acc_mask, other=0.0)
    weight = tl.exp2(m - tl.max(m, 0))  # an empty split has m = -1e30, l = 0 and weighs nothing
    total = tl.sum(l_s * weight, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + dims,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


def paged_attention(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMetadata,
    scale: float,
    num_splits: int | None = None,
    tile_n: int | None = None,
) -> Tensor:
    """Same contract as ``kernels.reference.paged_attention``; ``num_splits`` overrides the split-K policy."""
    check_attention_shapes(query, k_cache, v_cache, meta)
    check_runnable(_attention_kernel, query)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = k_cache.shape
    if query.stride(2) != 1 or k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("query and the caches need a contiguous last dimension, and equal cache strides")
    group = num_heads // kv_heads
    heads_p, dim_p = pow2(group), pow2(head_dim)
    decode_only = meta.max_query_len == 1
    block_q = 1 if decode_only else max(1, PREFILL_BLOCK_M // heads_p)
    block_m = max(DECODE_BLOCK_M if decode_only else PREFILL_BLOCK_M, block_q * heads_p)
    splits = num_splits or (num_kv_splits(meta, kv_heads, query.device) if decode_only else 1)
    out = query.new_empty(query.shape)
    if splits > 1:
        target = query.new_empty((num_tokens, num_heads, splits, dim_p), dtype=torch.float32)
        m, l_s = (query.new_empty((num_tokens, num_heads, splits), dtype=torch.float32) for _ in range(2))
    else:
        target, m, l_s = out, out, out  # m and l are unused without splits
    num_programs = meta.num_seqs if decode_only else num_tokens // block_q + meta.num_seqs
    _attention_kernel[(num_programs, kv_heads, splits)](
        query, k_cache, v_cache, target, m, l_s,
        meta.block_tables, meta.query_start_loc, meta.seq_lens,
        meta.num_seqs, scale * LOG2E,
        query.stride(0), query.stride(1), target.stride(0), target.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), meta.block_tables.stride(0),
        GROUP=group, HEADS_P=heads_p, BLOCK_Q=block_q, BLOCK_M=block_m,
        HEAD_DIM=head_dim, DIM_P=dim_p, BLOCK_SIZE=block_size,
        TILE_N=tile_n or (TILE_N // 2 if query.dtype == torch.float32 else TILE_N),
        NUM_SPLITS=splits, DECODE_ONLY=decode_only,
        UPCAST=query.dtype == torch.bfloat16 and not query.is_cuda,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=4 if decode_only else 8,
    )  # fmt: skip
    if splits > 1:
        _reduce_splits_kernel[(num_tokens, num_heads)](
            target, m, l_s, out, out.stride(0), out.stride(1),
            NUM_SPLITS=splits, SPLITS_P=pow2(splits), HEAD_DIM=head_dim, DIM_P=dim_p,
        )  # fmt: skip
    return out


def num_kv_splits(meta: AttentionMetadata, kv_heads: int, device: torch.device) -> int:
    """Key slices per (sequence, kv head) of a decode-only step: enough programs to fill the GPU,
    none shorter than MIN_SPLIT_KEYS. Depends only on host ints, so a CUDA graph captured with the
    longest context keeps a valid choice for every shorter one."""
    programs = meta.num_seqs * kv_heads
    free = _num_sms(device) // programs if device.type == "cuda" else 1
    return max(1, min(MAX_SPLITS, free, math.ceil(meta.max_seq_len / MIN_SPLIT_KEYS)))


_SM_COUNTS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]
