"""Small GGUF files written on the spot with the ``gguf`` package: weights quantized by its own
quantizers (Q8_0, Q4_0, Q4_1) or, for the types it cannot quantize (the K-quants), random block bytes
with sane float16 scales, which are valid weights of that type."""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

from kernels.quant_reference import TYPES

QUANTIZABLE = ("Q8_0", "Q4_0", "Q4_1", "F16", "BF16", "F32")
# Byte offsets of each K-quant block's float16 scales, and the value they get (a weight's magnitude
# stays near 0.02-0.1 with the random 4-6 bit values and 6/8-bit sub-block scales around them).
K_SCALES = {"Q4_K": {0: 2e-4, 2: 5e-4}, "Q5_K": {0: 1e-4, 2: 5e-4}, "Q6_K": {208: 5e-5}}


def ggml_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name]


def encode(values: np.ndarray, type_name: str, rng: np.random.Generator) -> np.ndarray:
    """``values`` (float32 [rows, cols]) as the type stores them: quantized bytes or float values. The
    K-quants ignore ``values``: their blocks are random."""
    if type_name == "F32":
        return values.astype(np.float32)
    if type_name in QUANTIZABLE:
        return quants.quantize(values.astype(np.float32), ggml_type(type_name))
    kind = TYPES[type_name]
    rows, cols = values.shape
    blocks = rng.integers(0, 256, size=(rows * cols // kind.block, kind.block_bytes), dtype=np.uint8)
    for at, scale in K_SCALES[type_name].items():
        d = (rng.uniform(0.5, 1.5, size=blocks.shape[0]) * scale).astype(np.float16)
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def decode(stored: np.ndarray, type_name: str) -> np.ndarray:
    """The ``gguf`` package's de-quantization: the reference our torch one must equal."""
    if type_name == "F32":
        return stored
    return quants.dequantize(stored, ggml_type(type_name)).astype(np.float32)


def write_gguf(
    path: Path, tensors: dict[str, tuple[str, np.ndarray]], arch: str = "llama", **metadata: int | float
) -> Path:
    """Write ``{name: (type, stored)}`` (``encode``'s output, or any GGML type's bytes) with
    ``general.architecture = arch`` and ``metadata`` as ``{arch}.{key}`` fields."""
    writer = GGUFWriter(path, arch)
    for key, value in metadata.items():
        add = writer.add_float32 if isinstance(value, float) else writer.add_uint32
        add(f"{arch}.{key}", value)
    for name, (type_name, stored) in tensors.items():
        raw = None if type_name in ("F32", "F16") else ggml_type(type_name)
        writer.add_tensor(name, stored, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
