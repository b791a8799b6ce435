"""What a loaded model's weights are in memory, described once at load: how many tensors of each type
(GGUF's type names: ``Q4_1``, ``Q8_0``, ``F32``, ...), their bytes, and which kernels multiply them.
The worker prints it in its ready line and publishes it with its heartbeat, for ``/v1/models`` and
``/readyz``.

A tensor shared by two modules (tied embeddings) counts once; a packed copy (a tied ``lm_head`` in
oneDNN's layout) counts as the memory it is. The rotary tables and the KV cache are not weights.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kernels import cpu
from worker.engine.model.cpu_linears import Fp16Linear, InvariantLinear, OneDNNLinear
from worker.engine.model.gguf_file import GGUFTensor
from worker.engine.model.gguf_layers import GGUFEmbedding, GGUFLinear

TYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


@dataclass(frozen=True)
class LoadedWeights:
    types: dict[str, int]  # tensors per type, e.g. {"Q4_1": 150, "F32": 61}
    bytes: int  # all of them, in memory
    kernels: str  # which kernels multiply them, e.g. "gguf-float-fma-avx2", "float32-invariant"

    def as_json(self) -> dict[str, Any]:
        return {"types": dict(self.types), "bytes": self.bytes, "kernels": self.kernels}


@dataclass(frozen=True)
class Held:
    type_name: str
    nbytes: int
    key: int  # the memory's address (or the object's id where it has none), to count shared tensors once


def describe(model: nn.Module, backend: str) -> LoadedWeights:
    """``model``'s weights as loaded, its linears run by the kernels ``backend`` names (``backend_for``)."""
    held = {item.key: item for module in model.modules() for item in _held(module)}
    types: dict[str, int] = {}
    for item in held.values():
        types[item.type_name] = types.get(item.type_name, 0) + 1
    kernels = sorted({name for module in model.modules() if (name := _kernels(module, backend))})
    return LoadedWeights(
        dict(sorted(types.items())), sum(item.nbytes for item in held.values()), "+".join(kernels)
    )


def _held(module: nn.Module) -> Iterator[Held]:
    """The weight tensors ``module`` itself holds (not its children's)."""
    if isinstance(module, GGUFLinear):
        if module.dense is not None:  # float parts, multiplied as one float32 matrix
            yield _tensor(module.dense)
        else:
            yield from (_gguf(part) for part in module.parts)
        tensors = [module.bias]
    elif isinstance(module, GGUFEmbedding):
        yield _gguf(module.table)
        tensors = []
    elif isinstance(module, Fp16Linear):  # fbgemm's packed object, which has no tensor to ask
        yield Held("F16", module.nbytes, id(module.packed))
        tensors = []
    elif isinstance(module, InvariantLinear):
        tensors = [module.weight, module.bias]
    elif isinstance(module, OneDNNLinear):
        tensors = [module.packed, module.bias]
    else:
        tensors = list(module.parameters(recurse=False))
    yield from (_tensor(t) for t in tensors if t is not None)


def _tensor(tensor: torch.Tensor) -> Held:
    key = id(tensor) if tensor.is_mkldnn else tensor.data_ptr()  # oneDNN's opaque layout has no address
    return Held(TYPE_NAMES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch.")), tensor.nbytes, key)


def _gguf(tensor: GGUFTensor) -> Held:
    return Held(tensor.type.name, tensor.nbytes, tensor.data.data_ptr())


def _kernels(module: nn.Module, backend: str) -> str | None:
    """The kernels a linear layer runs on, None for other modules."""
    if isinstance(module, GGUFLinear):
        if module.dense is not None:
            return "float32-torch"
        if backend != "cpu" or not cpu.available():
            return "gguf-torch-reference"  # de-quantize, then a float32 matmul
        path = "int8" if module.int8 else "float-fma"
        return f"gguf-{path}-{cpu.QUANT_LEVELS[cpu.quant_level()]}"
    if isinstance(module, InvariantLinear):
        return "float32-invariant"
    if isinstance(module, OneDNNLinear):
        return "float32-onednn"
    if isinstance(module, Fp16Linear):
        return "fp16-fbgemm"
    if isinstance(module, nn.Linear):
        return f"{str(module.weight.dtype).removeprefix('torch.')}-torch"
    return None
