"""Store the new tokens' K/V into the paged cache in Triton: one program per token.

A negative slot skips the token: CUDA-graph batches pad with slot -1.
"""

import triton
import triton.language as tl
from torch import Tensor

from kernels.reference import check_kv_shapes
from kernels.triton_common import check_runnable, pow2


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
    KV_HEADS: tl.constexpr, HEADS_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, DIM_P)[None, :]
    mask = (heads < KV_HEADS) & (dims < HEAD_DIM)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + heads * stride_ch + dims
    k = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Same contract as ``kernels.reference.write_kv``, plus: slot -1 writes nothing."""
    check_kv_shapes(key, value, k_cache, v_cache, slot_mapping)
    check_runnable(_write_kv_kernel, key)
    if key.stride(2) != 1 or value.stride(2) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("key and value need a contiguous last dimension, and the caches equal strides")
    num_tokens, kv_heads, head_dim = key.shape
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        KV_HEADS=kv_heads, HEADS_P=pow2(kv_heads), HEAD_DIM=head_dim, DIM_P=pow2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )  # fmt: skip
