"""A GGUF file's tensors as they are stored, memory-mapped: quantized ones as ``uint8 [rows, row_bytes]``
of blocks (``kernels.quant_reference``), float ones in their dtype. Nothing is de-quantized or copied here.

The header is read here (``_Header``), not by the ``gguf`` package: its reader makes a numpy array per
element of every metadata array, and a tokenizer's vocabulary and merges made that ~160 MB of peak and
~30 MB of kept heap for the default model's file. Arrays longer than 64 items (the tokenizer's, read
from tokenizer.json instead) are skipped; a tensor of a type pagedq does not run, or one that the file is
too short to hold, fails with an error naming it.
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from contract.engine import GGUF_VERSIONS, is_gguf_header
from kernels.quant_reference import BY_GGML_TYPE, FLOAT_DTYPES, TYPES, QuantType, dequantize

SUPPORTED_TYPES = ", ".join(TYPES)


class GGUFError(ValueError):
    """A GGUF file pagedq cannot serve: unreadable, truncated, or with a tensor type it does not run."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: QuantType
    shape: tuple[int, ...]  # torch's order: (rows, cols) for a matrix
    data: Tensor  # uint8 [rows, row_bytes] for a quantized type, else the values in their dtype

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def dequantize(self) -> Tensor:
        """float32 values of ``shape``: for tests and small tensors (norms), never a whole weight."""
        return dequantize(self.data.reshape(-1, self.data.shape[-1]), self.type.name).view(self.shape)


SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
STRING, ARRAY = 8, 9
LONG_ARRAY = 64  # longer metadata arrays (vocabularies, merges) are skipped, not decoded


class _Header:
    """GGUF v2/v3's header over the mapped bytes: metadata, then each tensor's name, shape, type and
    offset."""

    def __init__(self, data: np.ndarray) -> None:
        self.buf, self.at = memoryview(data), 8
        if not is_gguf_header(bytes(self.buf[:8])):
            raise ValueError(f"no GGUF magic, or a version other than {' or '.join(map(str, GGUF_VERSIONS))}")
        n_tensors, n_kv = self.read("<Q"), self.read("<Q")
        self.metadata = {self.string(): self.value(self.read("<I")) for _ in range(n_kv)}
        self.infos = [self.info() for _ in range(n_tensors)]
        align = int(self.metadata.get("general.alignment") or 32)
        self.data_start = -(-self.at // align) * align

    def read(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.read("<Q")
        if self.at + n > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        self.at += n
        return bytes(self.buf[self.at - n : self.at]).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind in SCALARS:
            return self.read(SCALARS[kind])
        if kind != ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self.read("<I"), self.read("<Q")
        if count <= LONG_ARRAY:
            return [self.value(item) for _ in range(count)]
        if item in SCALARS:
            self.at += count * struct.calcsize(SCALARS[item])
        else:
            for _ in range(count):
                self.value(item)
        return None

    def info(self) -> tuple[str, tuple[int, ...], int, int]:
        name, n_dims = self.string(), self.read("<I")
        dims = [self.read("<Q") for _ in range(n_dims)]
        return name, tuple(reversed(dims)), self.read("<I"), self.read("<Q")


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    @classmethod
    def open(cls, path: Path) -> "GGUFFile":
        try:
            data = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable views, pages shared
            header = _Header(data)
        except (ValueError, struct.error, OSError) as error:
            raise GGUFError(f"{path}: not a readable GGUF file (corrupt or truncated?): {error}") from None
        tensors = [_tensor(path, data, header.data_start, *info) for info in header.infos]
        return cls(Path(path), header.metadata, {t.name: t for t in tensors})


def _tensor(
    path: Path, data: np.ndarray, start: int, name: str, shape: tuple[int, ...], raw_type: int, offset: int
) -> GGUFTensor:
    kind = BY_GGML_TYPE.get(raw_type)
    if kind is None:
        raise GGUFError(
            f"{path}: tensor {name!r} has GGML type {_type_name(raw_type)}, which pagedq does not "
            f"run; supported: {SUPPORTED_TYPES}"
        )
    if shape[-1] % kind.block:
        raise GGUFError(
            f"{path}: tensor {name!r} ({kind.name}) has rows of {shape[-1]} values, not whole blocks"
        )
    start += offset
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    nbytes = rows * kind.row_bytes(shape[-1])
    if start + nbytes > data.size:
        raise GGUFError(
            f"{path}: tensor {name!r} ({kind.name}, {list(shape)}) needs bytes {start}..{start + nbytes} "
            f"but the file has {data.size}: truncated"
        )
    tensor = torch.from_numpy(data[start : start + nbytes])
    if kind.name in FLOAT_DTYPES:
        return GGUFTensor(name, kind, shape, tensor.view(FLOAT_DTYPES[kind.name]).view(shape))
    return GGUFTensor(name, kind, shape, tensor.view(*shape[:-1], kind.row_bytes(shape[-1])))


def _type_name(raw: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(raw).name
    except ValueError:
        return f"#{raw} (unknown)"
