"""The CPU kernels (``kernels/cpu_kernels.cpp``, ``kernels/cpu_quant_kernels.cpp`` for GGUF-quantized
weights, and ``kernels/cpu_decoder_layer.cpp``, a GGUF model's decoder layer in one call): built on first
use with torch's cpp_extension, once per machine, and loaded as ``torch.ops.pagedq_cpu``; ``available()``
is False (and says why once, in the log) when they cannot be built, and the dispatcher then runs the
torch reference.

The build lives in ``~/.cache/pagedq/cpu_kernels/<key>`` (``PAGEDQ_CPU_KERNELS_DIR`` moves it), keyed
by the source, torch's version and the CPU's flags: it is compiled with ``-march=native``, so a copy
on another CPU must not be reused. Concurrent first uses wait on one build.
"""

import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from pathlib import Path

import torch
from torch import Tensor

from kernels import reference
from kernels.metadata import AttentionMetadata

logger = logging.getLogger("pagedq.kernels")

SOURCES = [
    Path(__file__).with_name(name)
    for name in ("cpu_kernels.cpp", "cpu_quant_kernels.cpp", "cpu_decoder_layer.cpp")
]
DIR_ENV = "PAGEDQ_CPU_KERNELS_DIR"
# Sequences with at most this many new tokens attend in the C++ kernel; longer prefills use SDPA.
IN_PLACE_MAX_QUERY = 16
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"]


def cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags")), "")


def build_key() -> str:
    sources = b"".join(source.read_bytes() for source in SOURCES)
    return hashlib.sha256(f"{sources!r}{CFLAGS}{torch.__version__}{cpu_flags()}".encode()).hexdigest()[:16]


def build_dir() -> Path:
    root = os.environ.get(DIR_ENV) or Path.home() / ".cache" / "pagedq" / "cpu_kernels"
    return Path(root) / build_key()


def sources_in(where: Path) -> list[Path]:
    """The sources copied into the build directory, which is keyed by their content: ninja records each
    source's absolute path, so compiling a checkout's own files would make two checkouts of the same
    source rebuild each other's build on every first use."""
    copies = []
    for source in SOURCES:
        copy, text = where / source.name, source.read_bytes()
        if not copy.is_file() or copy.read_bytes() != text:
            copy.write_bytes(text)
        copies.append(copy)
    return copies


def add_ninja_to_path() -> None:
    """cpp_extension runs ``ninja`` from PATH; the ``ninja`` wheel's sits in the venv's bin, which is not
    on PATH when the venv's python is run without activating it."""
    if shutil.which("ninja") is None:
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


@functools.cache
def available() -> bool:
    """Whether ``torch.ops.pagedq_cpu`` is loaded: builds it on the first call of this process."""
    from torch.utils import cpp_extension

    start, where = time.perf_counter(), build_dir()
    try:
        add_ninja_to_path()
        where.mkdir(parents=True, exist_ok=True)
        # Our own lock, which the OS drops if its holder dies: cpp_extension's is a file that a build
        # killed midway leaves behind, and every later process would wait on it forever.
        with open(where.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (where / "lock").unlink(missing_ok=True)
            cpp_extension.load(
                name=f"pagedq_cpu_kernels_{build_key()}",  # one name per source: reloading it is a no-op
                sources=[str(path) for path in sources_in(where)],
                extra_cflags=CFLAGS,
                extra_ldflags=["-fopenmp"],
                build_directory=str(where),
                is_python_module=False,
            )
    except Exception as exc:  # a missing compiler, headers or a failed build: the reference runs instead
        logger.warning(
            "CPU kernels unavailable, running the torch reference: %s",
            " ".join(str(exc).split())[:300],
            extra={"build_dir": str(where)},
        )
        return False
    logger.info(
        "CPU kernels loaded in %.1f s",
        time.perf_counter() - start,
        extra={"build_dir": str(where)},
    )
    return True


def paged_attention(
    query: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata, scale: float
) -> Tensor:
    """The reference's contract (``kernels.reference.paged_attention``). Decodes and short prefill chunks
    read their K/V blocks in place; longer prefills are gathered once and go through SDPA, whose
    matmul-based attention is faster when many queries share the keys (the gather is then small), unless
    ``meta.batch_invariant``: then every row attends in place, as it would in a decode step."""
    reference.check_attention_shapes(query, k_cache, v_cache, meta)
    max_query = in_place_max_query(meta)
    out = torch.ops.pagedq_cpu.paged_attention(
        query,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.query_start_loc,
        meta.seq_lens,
        scale,
        max_query,
    )
    long_prefills = [seq for seq in meta.prefills if seq.end - seq.start > max_query]
    if long_prefills:
        buffer = meta.gather_buffer(k_cache)
        for seq in long_prefills:
            k, v = reference.gather(k_cache, v_cache, seq.block_ids, 1, buffer)
            out[seq.start : seq.end] = reference.prefill(query, k, v, seq, scale)
    return out


def in_place_max_query(meta: AttentionMetadata) -> int:
    """The longest query a sequence attends in place with this step (longer prefills go through SDPA)."""
    return meta.num_tokens if meta.batch_invariant else IN_PLACE_MAX_QUERY


def attends_in_place(meta: AttentionMetadata) -> bool:
    """Whether every sequence of this step attends in the C++ kernel (no long prefill)."""
    return meta.max_query_len <= in_place_max_query(meta)


def encoder_attention(qkv: Tensor, lens: list[int], heads: int) -> Tensor:
    """The reference's contract (``kernels.reference.encoder_attention``): every row attends in place, in
    one parallel call for the whole batch, and its result does not depend on the other inputs."""
    scale = (qkv.shape[1] // (3 * heads)) ** -0.5
    return torch.ops.pagedq_cpu.encoder_attention(qkv, lens, heads, scale)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.ops.pagedq_cpu.add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: Tensor) -> Tensor:
    return torch.ops.pagedq_cpu.silu_and_mul(x)


def write_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """The reference's contract (``kernels.reference.write_kv``) for key and value in the caches' dtype."""
    torch.ops.pagedq_cpu.write_kv(key, value, k_cache, v_cache, slot_mapping)


def rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """Rotates ``x`` in place and returns it."""
    return torch.ops.pagedq_cpu.rotate(x, cos, signed_sin)


def quant_linear(
    x: Tensor, weights: list[Tensor], ggml_types: list[int], level: int = -1, int8: bool = False
) -> Tensor:
    """``x`` (float32 ``[M, K]``) times GGUF-quantized weights side by side (``uint8 [N_i, row_bytes]``
    each): ``[M, sum N_i]``. ``int8``: activations quantized per 32-value block and integer dot products
    (llama.cpp's way); else the weights are de-quantized in registers and multiplied in float32.
    ``level``: 0 scalar, 1 AVX2, 2 AVX-512 VNNI, -1 the best this CPU runs; every level returns the same
    bits, and a row's result does not depend on the other rows."""
    return torch.ops.pagedq_cpu.quant_linear(x, weights, ggml_types, level, not int8)


QUANT_LEVELS = ("scalar", "avx2", "avx512-vnni")  # quant_linear's levels 0, 1 and 2, by name


def quant_level() -> int:
    """The best ``quant_linear`` level this CPU runs (an index of ``QUANT_LEVELS``)."""
    return torch.ops.pagedq_cpu.quant_level()


def invariant_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` on float32, each output the same bits whatever else is in ``x``'s batch (see the
    kernel's comment)."""
    return torch.ops.pagedq_cpu.invariant_linear(x, weight, bias)


def pack_invariant_linear(weight: Tensor) -> Tensor | None:
    """``weight`` [N, K] repacked for ``invariant_linear_packed``, where this CPU's kernel multiplies
    faster so (AVX2 without AVX-512; K a multiple of 16); None where ``invariant_linear`` reads it as
    it is."""
    if weight.shape[1] % 16 or not torch.ops.pagedq_cpu.packs_invariant_linear():
        return None
    return torch.ops.pagedq_cpu.pack_invariant_linear(weight)


def invariant_linear_packed(x: Tensor, packed: Tensor, out_features: int, bias: Tensor | None) -> Tensor:
    """``invariant_linear`` (the same bits) on a weight from ``pack_invariant_linear``."""
    return torch.ops.pagedq_cpu.invariant_linear_packed(x, packed, out_features, bias)


def gguf_decoder_layer(
    x: Tensor,
    residual: Tensor,
    norms: tuple[Tensor, Tensor],
    eps: float,
    linears: "list[tuple[list[Tensor], list[int]]]",
    qkv_bias: Tensor | None,
    float_x: bool,
    rotation: tuple[Tensor, Tensor],
    kv_cache: tuple[Tensor, Tensor],
    meta: AttentionMetadata,
    scale: float,
    heads: tuple[int, int],
) -> tuple[Tensor, Tensor]:
    """A Llama decoder layer on GGUF weights in one call: ``(mlp_out, residual)``, the same bits as its
    kernels called one by one. ``linears``: (weights, GGML types) of qkv, o, gate_up and down; ``heads``:
    (query heads, kv heads). Only for steps that ``attends_in_place``."""
    (qkv, qkv_types), (o, o_types), (gate_up, gate_up_types), (down, down_types) = linears
    return torch.ops.pagedq_cpu.gguf_decoder_layer(
        x, residual, norms[0], norms[1], eps,
        qkv, qkv_types, qkv_bias, o, o_types, gate_up, gate_up_types, down, down_types, float_x,
        rotation[0], rotation[1], kv_cache[0], kv_cache[1],
        meta.slot_mapping, meta.block_tables, meta.query_start_loc, meta.seq_lens,
        scale, in_place_max_query(meta), heads[0], heads[1],
    )  # fmt: skip
