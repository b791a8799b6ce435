"""Paged-attention ops in plain torch: the CPU path, and the oracle for the Triton kernels.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``; token slot
``block_id * block_size + offset`` is row ``slot`` of the cache viewed as ``[-1, kv_heads, dim]``.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.metadata import AttentionMetadata, DecodeChunk, PrefillSeq


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Store the K/V of T new tokens (``[T, kv_heads, head_dim]``) at their cache slots, in place."""
    if key.shape != value.shape or key.shape[1:] != k_cache.shape[2:] or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit caches "
            f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}"
        )
    if slot_mapping.shape != key.shape[:1]:
        raise ValueError(f"slot_mapping {tuple(slot_mapping.shape)} for {key.shape[0]} tokens")
    # view (not reshape): a copy would silently drop the writes.
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


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
    num_kv_heads)``. Returns ``[T, num_heads, head_dim]`` in the query's dtype.
    """
    _check_shapes(query, k_cache, v_cache, meta)
    out = torch.empty_like(query)
    for chunk in meta.decode_chunks:
        out.index_copy_(0, chunk.token_index, _decode(query, k_cache, v_cache, chunk, scale))
    for seq in meta.prefills:
        out[seq.start : seq.end] = _prefill(query, k_cache, v_cache, seq, scale)
    return out


def _check_shapes(query: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata) -> None:
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


def _gather(cache: Tensor, block_index: Tensor, num_seqs: int) -> Tensor:
    """The listed blocks as ``[num_seqs, kv_heads, tokens, head_dim]`` (sequence-major blocks)."""
    _, _, kv_heads, head_dim = cache.shape
    return cache.index_select(0, block_index).view(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)


def _decode(query: Tensor, k_cache: Tensor, v_cache: Tensor, chunk: DecodeChunk, scale: float) -> Tensor:
    """One token per sequence: the G query heads sharing a kv head act as G query rows, so GQA
    needs neither expanded K/V nor ``enable_gqa`` (measured fastest on CPU)."""
    seqs, head_dim = chunk.token_index.shape[0], query.shape[2]
    q = query.index_select(0, chunk.token_index).view(seqs, k_cache.shape[2], -1, head_dim)
    k, v = (_gather(c, chunk.block_index, seqs) for c in (k_cache, v_cache))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk.key_mask, scale=scale)
    return o.reshape(seqs, -1, head_dim)


def _prefill(query: Tensor, k_cache: Tensor, v_cache: Tensor, seq: PrefillSeq, scale: float) -> Tensor:
    q = query[seq.start : seq.end].transpose(0, 1).unsqueeze(0)
    k, v = (_gather(c, seq.block_ids, 1)[:, :, : seq.seq_len] for c in (k_cache, v_cache))
    o = F.scaled_dot_product_attention(
        q, k, v, attn_mask=seq.mask, is_causal=seq.mask is None, scale=scale, enable_gqa=True
    )
    return o.squeeze(0).transpose(0, 1)
