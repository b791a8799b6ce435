"""The kernels in plain torch (paged attention, KV writes, RMSNorm, SiLU*mul): the CPU path, and
the oracle for the Triton kernels.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``; token slot
``block_id * block_size + offset`` is row ``slot`` of the cache viewed as ``[-1, kv_heads, dim]``.
"""

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.metadata import AttentionMetadata, DecodeChunk, PrefillSeq


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Store the K/V of T new tokens (``[T, kv_heads, head_dim]``) at their cache slots, in place."""
    check_kv_shapes(key, value, k_cache, v_cache, slot_mapping)
    # view (not reshape): a copy would silently drop the writes.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def check_kv_shapes(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    if key.shape != value.shape or key.shape[1:] != k_cache.shape[2:] or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit caches "
            f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}"
        )
    if slot_mapping.shape != key.shape[:1]:
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} for {key.shape[0]} tokens")


def copy_blocks(k_cache: Tensor, v_cache: Tensor, src_to_dst: Tensor) -> None:
    """Copy whole cache blocks ``src -> dst`` for each row of ``src_to_dst`` (``[N, 2]``), in place."""
    if src_to_dst.dim() != 2 or src_to_dst.shape[1] != 2:
        raise ValueError(f"src_to_dst must be [N, 2], got {tuple(src_to_dst.shape)}")
    src, dst = src_to_dst[:, 0], src_to_dst[:, 1]
    for cache in (k_cache, v_cache):
        cache.index_copy_(0, dst, cache.index_select(0, src))


def paged_attention(
    query: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float
) -> Tensor:
    """Causal attention of the new tokens over their sequences' cached K/V (new tokens included).

    ``query`` is ``[T, num_heads, head_dim]``; query head h reads kv head ``h // (num_heads //
    num_kv_heads)``. Returns ``[T, num_heads, head_dim]`` in the query's dtype. Slots past a
    sequence's end in its last block are read and masked out, so they must hold finite values
    (allocate caches with ``torch.zeros``): 0 * NaN would still be NaN.
    """
    check_attention_shapes(query, k_cache, v_cache, meta)
    out = query.new_empty(query.shape)  # contiguous, whatever the query's strides
    buffer = meta.gather_buffer(k_cache)
    for chunk in meta.decode_chunks:
        k, v = gather(k_cache, v_cache, chunk.block_index, chunk.token_index.shape[0], buffer)
        out.index_copy_(0, chunk.token_index, _decode(query, k, v, chunk, scale))
    for seq in meta.prefills:
        k, v = gather(k_cache, v_cache, seq.block_ids, 1, buffer)
        out[seq.start : seq.end] = prefill(query, k, v, seq, scale)
    return out


def encoder_attention(qkv: Tensor, lens: list[int], heads: int) -> Tensor:
    """Bidirectional attention of each packed input over its own tokens (an encoder's, no KV cache).

    ``qkv`` is ``[T, 3 * heads * head_dim]`` (q, k, v side by side in each row), input b its next
    ``lens[b]`` rows; returns ``[T, heads * head_dim]``, scaled by ``head_dim ** -0.5``. Each run of
    equal-length inputs is one SDPA call over ``[inputs, heads, length, head_dim]``: no mask, no padding.
    """
    q, k, v = qkv.view(qkv.shape[0], 3, heads, -1).unbind(1)
    out = qkv.new_empty(qkv.shape[0], qkv.shape[1] // 3)
    first = 0
    for length, run in itertools.groupby(lens):
        count = len(list(run))
        rows = slice(first, first + count * length)
        qs, ks, vs = (x[rows].view(count, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        attended = F.scaled_dot_product_attention(qs, ks, vs)  # [count, heads, length, head_dim]
        out[rows].view(count, length, *q.shape[1:]).copy_(attended.transpose(1, 2))
        first += count * length
    return out


def check_attention_shapes(query: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> None:
    if query.dim() != 3 or query.shape[0] != meta.num_tokens:
        raise ValueError(f"query must be [{meta.num_tokens}, heads, head_dim], got {tuple(query.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ")
    _, block_size, kv_heads, head_dim = k_cache.shape
    if block_size != meta.block_size or head_dim != query.shape[2] or query.shape[1] % kv_heads:
        raise ValueError(
            f"cache {tuple(k_cache.shape)} does not fit query {tuple(query.shape)} "
            f"with block_size {meta.block_size}"
        )


def gather(
    k_cache: Tensor, v_cache: Tensor, block_index: Tensor, num_seqs: int, buffer: Tensor
) -> tuple[Tensor, Tensor]:
    """The listed blocks (sequence-major) as K and V ``[num_seqs, kv_heads, tokens, head_dim]``."""
    _, _, kv_heads, head_dim = k_cache.shape
    rows = block_index.shape[0]
    k = torch.index_select(k_cache, 0, block_index, out=buffer[0, :rows])
    v = torch.index_select(v_cache, 0, block_index, out=buffer[1, :rows])
    shape = (num_seqs, -1, kv_heads, head_dim)
    return k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)


def _decode(query: Tensor, k: Tensor, v: Tensor, chunk: DecodeChunk, scale: float) -> Tensor:
    """One token per sequence: the G query heads sharing a kv head act as G query rows, so GQA
    needs neither expanded K/V nor ``enable_gqa`` (measured fastest on CPU)."""
    seqs, kv_heads, _, head_dim = k.shape
    q = query.index_select(0, chunk.token_index).view(seqs, kv_heads, -1, head_dim)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk.key_mask, scale=scale)
    return o.reshape(seqs, -1, head_dim)


def prefill(query: Tensor, k: Tensor, v: Tensor, seq: PrefillSeq, scale: float) -> Tensor:
    q = query[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
    k, v = k[:, :, : seq.seq_len], v[:, :, : seq.seq_len]  # drop the last block's tail
    o = F.scaled_dot_product_attention(
        q, k, v, attn_mask=seq.mask, is_causal=seq.mask is None, scale=scale, enable_gqa=True
    )
    return o.squeeze(0).transpose(0, 1)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``weight * rmsnorm(x)``, normalised in float32 as Hugging Face does so low-precision outputs match."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(rms_norm(x + residual), x + residual)``."""
    total = x + residual
    return rms_norm(total, weight, eps), total


def silu_and_mul(x: Tensor) -> Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]`` split along the last dimension."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotary embedding of ``x`` ``[T, heads, D]`` with ``cos`` and ``signed_sin = [-sin | sin]``
    ``[T, 1, D]``: ``rotate_half(x) * sin`` becomes ``x.roll(D/2) * signed_sin``."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
