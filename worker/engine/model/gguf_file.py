"""A GGUF file's tensors as they are stored, memory-mapped: quantized ones as ``uint8 [rows, row_bytes]``
of blocks (``kernels.quant_reference``), float ones in their dtype. Nothing is de-quantized or copied here.

The ``gguf`` package parses the header and metadata; the tensors are built here, so that a tensor of a
type pagedq does not run, or one that the file is too short to hold, fails with an error naming it.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType
from torch import Tensor

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


class _HeaderReader(GGUFReader):
    """``GGUFReader`` up to the tensor infos: the tensors are built by ``GGUFFile``."""

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        self.tensor_start, self.tensor_fields = start_offs, fields


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
            reader = _HeaderReader(path, mode="c")  # copy-on-write: writable views, pages shared
        except Exception as error:  # the package raises ValueError, IndexError, ... on a bad header
            raise GGUFError(f"{path}: not a readable GGUF file (corrupt or truncated?): {error}") from None
        metadata = {name: _value(field) for name, field in reader.fields.items()}
        tensors = [_tensor(path, reader, field) for field in reader.tensor_fields]
        return cls(Path(path), metadata, {t.name: t for t in tensors})


def _value(field: Any) -> Any:
    if not field.types or (field.types[0] == GGUFValueType.ARRAY and len(field.data) > 64):
        return None  # vocabularies and merges: the tokenizer's, not read here
    try:
        return field.contents()
    except Exception:  # a field the package cannot decode: not one the engine reads
        return None


def _tensor(path: Path, reader: _HeaderReader, field: Any) -> GGUFTensor:
    _, name_bytes, _, dims, raw_type, offset = field.parts
    name = bytes(name_bytes).decode("utf-8", "replace")
    kind = BY_GGML_TYPE.get(int(raw_type[0]))
    if kind is None:
        raise GGUFError(
            f"{path}: tensor {name!r} has GGML type {_type_name(int(raw_type[0]))}, which pagedq does not "
            f"run; supported: {SUPPORTED_TYPES}"
        )
    shape = tuple(int(d) for d in reversed(dims.tolist()))
    if shape[-1] % kind.block:
        raise GGUFError(
            f"{path}: tensor {name!r} ({kind.name}) has rows of {shape[-1]} values, not whole blocks"
        )
    start = reader.tensor_start + int(offset[0])
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    nbytes = rows * kind.row_bytes(shape[-1])
    if start + nbytes > reader.data.size:
        raise GGUFError(
            f"{path}: tensor {name!r} ({kind.name}, {list(shape)}) needs bytes {start}..{start + nbytes} "
            f"but the file has {reader.data.size}: truncated"
        )
    data = torch.from_numpy(reader.data[start : start + nbytes])
    if kind.name in FLOAT_DTYPES:
        return GGUFTensor(name, kind, shape, data.view(FLOAT_DTYPES[kind.name]).view(shape))
    return GGUFTensor(name, kind, shape, data.view(*shape[:-1], kind.row_bytes(shape[-1])))


def _type_name(raw: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(raw).name
    except ValueError:
        return f"#{raw} (unknown)"
