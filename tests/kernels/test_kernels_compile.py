"""Every Triton kernel, launched as the engine launches it, compiles for the H100 (sm_90) and the
A100 (sm_80) without spilling registers.

No GPU needed: the launches are recorded instead of run, then compiled ahead of time with the
specialisations Triton's JIT would apply (16-byte aligned pointers, ints divisible by 16) and Triton's
own ptxas. What this cannot show is speed, or correctness, which tests/kernels/test_kernels_triton.py covers.
"""

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from tests.kernels.test_kernels_reference import make_meta

try:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from kernels import triton_activation, triton_paged_attention, triton_rmsnorm, triton_write_kv
except ImportError as error:  # a platform without a Triton wheel
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise
    pytest.skip(f"triton is not importable: {error}", allow_module_level=True)
if not isinstance(triton_write_kv._write_kv_kernel, JITFunction):
    pytest.skip("TRITON_INTERPRET=1: the kernels are interpreted, not compiled", allow_module_level=True)

MODULES = (triton_activation, triton_paged_attention, triton_rmsnorm, triton_write_kv)
TYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int32: "i32",
    torch.int64: "i64",
}
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


class Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, kernel: JITFunction, calls: list) -> None:
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list:
    calls: list = []
    for module in MODULES:
        for name, value in vars(module).copy().items():
            if isinstance(value, JITFunction):
                monkeypatch.setattr(module, name, Recorder(value, calls))
            elif name == "check_runnable":
                monkeypatch.setattr(module, name, lambda kernel, tensor: None)
    return calls


def compile_for(kernel: JITFunction, args: tuple, kwargs: dict, capability: int) -> int:
    """Compile one recorded launch; returns the kernel's stack bytes (register spills)."""
    bound = dict(zip(kernel.arg_names, args, strict=False)) | kwargs
    options = {k: bound.pop(k) for k in ("num_warps", "num_stages") if k in bound}
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(kernel.arg_names):
        value = bound[name]
        if i in kernel.constexprs:
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name], attrs[(i,)] = f"*{TYPES[value.dtype]}", [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constants, attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"pagedq-{kernel.__name__}-{os.getpid()}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        usage = subprocess.run([CUOBJDUMP, "-res-usage", cubin], capture_output=True, text=True, check=True)
    finally:
        cubin.unlink()
    return int(re.search(r"STACK:(\d+)", usage.stdout).group(1))


def attention_launch(batch, group, head_dim, block_size, dtype, num_splits=None) -> None:
    query_lens, seq_lens = zip(*batch, strict=True)
    tables = [list(range(1, -(-s // block_size) + 1)) for s in seq_lens]
    meta = make_meta(query_lens, seq_lens, tables, block_size)
    meta = dataclasses.replace(meta, query_start_loc=meta.query_start_loc.int(), seq_lens=meta.seq_lens.int())
    cache = torch.zeros(8, block_size, 8, head_dim, dtype=dtype)
    query = torch.zeros(meta.num_tokens, 8 * group, head_dim, dtype=dtype)
    triton_paged_attention.paged_attention(query, cache, cache, meta, head_dim**-0.5, num_splits)


DECODES = [(1, 100), (1, 40)]
MIXED = [(1, 100), (20, 75)]
LAUNCHES = {
    "decode bf16 head 128 group 4": lambda: attention_launch(DECODES, 4, 128, 16, torch.bfloat16),
    "split-K decode bf16": lambda: attention_launch(DECODES, 4, 128, 16, torch.bfloat16, num_splits=4),
    "mixed bf16 head 128 group 4": lambda: attention_launch(MIXED, 4, 128, 16, torch.bfloat16),
    "mixed fp16 head 64 group 1, block 32": lambda: attention_launch(MIXED, 1, 64, 32, torch.float16),
    "mixed fp32 head 128 group 8": lambda: attention_launch(MIXED, 8, 128, 16, torch.float32),
    "write_kv bf16": lambda: triton_write_kv.write_kv(
        *(torch.zeros(3, 8, 128, dtype=torch.bfloat16) for _ in range(2)),
        *(torch.zeros(4, 16, 8, 128, dtype=torch.bfloat16) for _ in range(2)),
        torch.tensor([0, 5, -1]),
    ),
    "add_rms_norm bf16 4096": lambda: triton_rmsnorm.add_rms_norm(
        *(torch.zeros(3, 4096, dtype=torch.bfloat16) for _ in range(3)), 1e-5
    ),
    "silu_and_mul bf16 14336": lambda: triton_activation.silu_and_mul(
        torch.zeros(3, 2 * 14336, dtype=torch.bfloat16)
    ),
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_kernels_compile_for_sm90_without_spills(launches: list, launch: str) -> None:
    LAUNCHES[launch]()
    assert launches
    for kernel, args, kwargs in launches:
        assert compile_for(kernel, args, kwargs, 90) == 0, f"{kernel.__name__} spills registers"


def test_attention_compiles_for_sm80(launches: list) -> None:
    LAUNCHES["mixed bf16 head 128 group 4"]()
    LAUNCHES["split-K decode bf16"]()
    for kernel, args, kwargs in launches:
        assert compile_for(kernel, args, kwargs, 80) == 0, f"{kernel.__name__} spills registers"
