"""GGUF's block formats in plain torch: one de-quantizer per type, the oracle for the C++ kernels
(``kernels/cpu_quant_kernels.cpp``) and the path where they do not run.

A quantized tensor is kept as its bytes, ``uint8 [rows, row_bytes]``: each row is ``cols / block``
blocks of ``block_bytes`` bytes laid out as ggml writes them (ggml-common.h). Values de-quantize in the
same float32 operation order as the ``gguf`` package's numpy code, so the two agree bit for bit.
F32, F16 and BF16 tensors are kept in their own dtype.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

QK_K = 256  # values in a K-quant super-block


@dataclass(frozen=True)
class QuantType:
    name: str
    ggml_type: int  # GGMLQuantizationType's value
    block: int  # values per block
    block_bytes: int
    dequantize_blocks: Callable[[Tensor], Tensor] | None  # uint8 [n, block_bytes] -> float32 [n, block]

    def row_bytes(self, cols: int) -> int:
        return cols // self.block * self.block_bytes


def _f16(blocks: Tensor, at: int) -> Tensor:
    """The float16 at byte ``at`` of each block, as float32 ``[n, 1]``."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """``[n, k]`` bytes -> ``[n, 2k]``: the low nibbles, then the high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def q8_0(blocks: Tensor) -> Tensor:
    return _f16(blocks, 0) * blocks[:, 2:].contiguous().view(torch.int8).float()


def q4_0(blocks: Tensor) -> Tensor:
    return _f16(blocks, 0) * (_nibbles(blocks[:, 2:]).to(torch.int8) - 8).float()


def q4_1(blocks: Tensor) -> Tensor:
    return _f16(blocks, 0) * _nibbles(blocks[:, 4:]).float() + _f16(blocks, 2)


def k_scales(scales: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K's 12 bytes -> the 8 sub-blocks' 6-bit scales and mins, ``[n, 8]`` each."""
    d, m, m_d = scales.view(-1, 3, 4).unbind(1)
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_affine(blocks: Tensor, q: Tensor) -> Tensor:
    """``d * sc * q - dmin * m`` per 32-value sub-block, for q ``[n, 8, 32]``."""
    n = blocks.shape[0]
    sc, mn = k_scales(blocks[:, 4:16])
    d = (_f16(blocks, 0) * sc.float()).view(n, 8, 1)
    dm = (_f16(blocks, 2) * mn.float()).view(n, 8, 1)
    return (d * q.float() - dm).view(n, QK_K)


def _k_low_nibbles(qs: Tensor) -> Tensor:
    """128 bytes -> ``[n, 8, 32]``: chunk i's low nibbles are sub-block 2i, its high ones 2i + 1."""
    qs = qs.view(-1, 4, 1, 32)
    return torch.cat([qs & 0x0F, qs >> 4], dim=2).view(-1, 8, 32)


def q4_k(blocks: Tensor) -> Tensor:
    return _k_affine(blocks, _k_low_nibbles(blocks[:, 16:144]))


def q5_k(blocks: Tensor) -> Tensor:
    high = blocks[:, 16:48].reshape(-1, 1, 32) >> torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
    return _k_affine(blocks, _k_low_nibbles(blocks[:, 48:176]) | ((high & 1) << 4))


def _shifts(*bits: int) -> Tensor:
    return torch.tensor(bits, dtype=torch.uint8).view(1, 1, -1, 1)


def q6_k(blocks: Tensor) -> Tensor:
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 1, 64) >> _shifts(0, 4)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6)
    q = ((ql & 0x0F).reshape(n, 8, 32) | ((qh & 0x03).reshape(n, 8, 32) << 4)).to(torch.int8) - 32
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(blocks, 208) * scales).view(n, 16, 1)
    return (d * q.view(n, 16, 16).float()).view(n, QK_K)


TYPES = {
    t.name: t
    for t in (
        QuantType("F32", 0, 1, 4, None),
        QuantType("F16", 1, 1, 2, None),
        QuantType("Q4_0", 2, 32, 18, q4_0),
        QuantType("Q4_1", 3, 32, 20, q4_1),
        QuantType("Q8_0", 8, 32, 34, q8_0),
        QuantType("Q4_K", 12, QK_K, 144, q4_k),
        QuantType("Q5_K", 13, QK_K, 176, q5_k),
        QuantType("Q6_K", 14, QK_K, 210, q6_k),
        QuantType("BF16", 30, 1, 2, None),
    )
}
BY_GGML_TYPE = {t.ggml_type: t for t in TYPES.values()}
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
QUANTIZED = tuple(name for name, t in TYPES.items() if t.dequantize_blocks is not None)


def dequantize(data: Tensor, type_name: str) -> Tensor:
    """float32 ``[rows, cols]`` from a tensor as it is stored: ``uint8 [rows, row_bytes]`` of blocks of
    a quantized type, or the values of a float one."""
    kind = TYPES[type_name]
    if kind.dequantize_blocks is None:
        return data.float()
    rows = data.shape[0]
    return kind.dequantize_blocks(data.reshape(-1, kind.block_bytes)).view(rows, -1)


def linear(x: Tensor, data: Tensor, type_name: str, rows_per_chunk: int = 4096) -> Tensor:
    """``x @ dequantize(data).T`` in float32, de-quantizing a few thousand rows at a time, so a float32
    copy of the whole weight never exists."""
    x = x.float()
    parts = [x @ dequantize(part, type_name).T for part in data.split(rows_per_chunk)]
    return torch.cat(parts, dim=-1)
