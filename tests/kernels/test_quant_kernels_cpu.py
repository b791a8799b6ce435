"""The C++ quantized linear (kernels/cpu_quant_kernels.cpp) against de-quantize-then-matmul in float64,
on both of its paths.

The float path de-quantizes the weights in registers (the reference's bits) and multiplies in float32
FMAs: it differs from the exact product by float32 summation rounding only. Each of 16 lanes sums K / 16
products, then 4 adds: at most (K / 16 + 4) roundings of 2**-24 relative to sum |x| |w|, the bound held
here per output (2.1e-6 at K = 512); and it must be far inside one int8 rounding of the activations.
The int8 path quantizes each activation row to int8 per 32-value block (scale d = max|x| / 127), so each
activation is off by at most d / 2: the output may differ from the exact product by at most sum over
blocks of (max|x_block| / 254) * sum |w_block|, plus float32 rounding. That bound is what the
tests hold it to, per output. And exactly: a row's output is the same bits alone and in a batch of 64,
and the same bits at every SIMD level the CPU has (scalar, AVX2, AVX-512 VNNI).
"""

import os

import numpy as np
import pytest
import torch

import kernels.cpu
from kernels import quant_reference
from tests.support.gguf_files import encode

TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(autouse=True)
def built() -> None:
    if not kernels.cpu.available():
        if os.environ.get("CI"):
            pytest.fail("the CPU kernels did not build; see the warning in the log")
        pytest.skip("the CPU kernels did not build")


def weight(type_name: str, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(encode(rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32), type_name, rng))


def activations(rows: int, cols: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[:, :32] *= 20  # an outlier block, as hidden states have
    return x


def int8(x: torch.Tensor, stored: list[torch.Tensor], types: list[int], level: int = -1) -> torch.Tensor:
    return kernels.cpu.quant_linear(x, stored, types, level, int8=True)


def activation_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``[M, N]``: how far activation rounding can move each output (see the module's docstring)."""
    step = x.abs().view(x.shape[0], -1, 32).amax(-1) / 254  # [M, blocks]: half a quantization step
    w_abs = w.abs().view(w.shape[0], -1, 32).sum(-1)  # [N, blocks]
    rounding = 1e-5 * (x.abs().double() @ w.abs().double().T)
    return step.double() @ w_abs.double().T + rounding


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("m_rows", [1, 3, 16, 70])
def test_equals_dequantize_then_matmul_within_the_activation_rounding(type_name: str, m_rows: int) -> None:
    stored, x = weight(type_name, 37, 512), activations(m_rows, 512)
    ggml = quant_reference.TYPES[type_name].ggml_type
    got = int8(x, [stored], [ggml])
    w = quant_reference.dequantize(stored, type_name)
    want = x.double() @ w.double().T
    error = (got.double() - want).abs()
    bound = activation_bound(x, w)
    assert (error <= bound).all(), f"worst {(error / bound).max():.2f}x the bound"
    assert error.max() > 0  # the activations were quantized: not a float path in disguise
    # The bound is a worst case (every rounding the same way); typical errors are far smaller.
    assert error.mean() < 0.01 * want.abs().mean()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("m_rows", [1, 3, 16, 70])
def test_float_path_equals_dequantize_then_matmul_to_float32_rounding(type_name: str, m_rows: int) -> None:
    stored, x = weight(type_name, 37, 512), activations(m_rows, 512)
    ggml = quant_reference.TYPES[type_name].ggml_type
    got = kernels.cpu.quant_linear(x, [stored], [ggml])
    w = quant_reference.dequantize(stored, type_name)
    want = x.double() @ w.double().T
    error = (got.double() - want).abs()
    bound = (512 / 16 + 4) * 2**-24 * (x.abs().double() @ w.abs().double().T)
    assert (error <= bound).all(), f"worst {(error / bound).max():.2f}x the bound"
    # Far inside what one int8 rounding of the activations would move it.
    assert error.max() < 0.01 * activation_bound(x, w).min()


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("path", ["float", "int8"])
def test_a_row_is_the_same_bits_alone_and_in_a_batch_at_every_level(type_name: str, path: str) -> None:
    stored, x = weight(type_name, 19, 256, seed=3), activations(64, 256, seed=4)
    ggml = quant_reference.TYPES[type_name].ggml_type

    def run(rows: torch.Tensor, level: int = -1) -> torch.Tensor:
        return kernels.cpu.quant_linear(rows, [stored], [ggml], level, int8=path == "int8")

    batch = run(x)
    for i in (0, 5, 63):
        assert torch.equal(run(x[i : i + 1]), batch[i : i + 1])
        assert torch.equal(run(x[i : i + 3])[0], batch[i])
    for level in range(kernels.cpu.quant_level() + 1):
        assert torch.equal(run(x, level), batch), f"level {level}"


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("path", ["float", "int8"])
@pytest.mark.parametrize("k", [256, 2048])
def test_a_row_is_the_same_bits_in_any_batch_and_tile_position(type_name: str, path: str, k: int) -> None:
    """From 5 rows on, the kernels run blocked (tiles of rows x weight rows; at K = 2048 several blocks of
    rows): a row's bits must not depend on how many rows came with it, nor where in a tile it landed."""
    stored, x = weight(type_name, 19, k, seed=5), activations(64, k, seed=6)
    ggml = quant_reference.TYPES[type_name].ggml_type
    order = torch.randperm(64, generator=torch.Generator().manual_seed(7))

    def run(rows: torch.Tensor, level: int) -> torch.Tensor:
        return kernels.cpu.quant_linear(rows, [stored], [ggml], level, int8=path == "int8")

    scalar = run(x, 0)
    for level in range(kernels.cpu.quant_level() + 1):
        assert torch.equal(run(x, level), scalar), f"level {level}"
        for m_rows in (1, 5, 16, 64):
            rows = order[:m_rows]
            assert torch.equal(run(x[rows], level), scalar[rows]), f"level {level}, {m_rows} rows"


def test_weights_of_several_types_side_by_side() -> None:
    """How a fused q/k/v projection runs when its parts were quantized differently (a Q4_K_M file)."""
    parts = [("Q4_K", 24), ("Q6_K", 8), ("Q8_0", 8)]
    stored = [weight(name, rows, 256, seed=i) for i, (name, rows) in enumerate(parts)]
    types = [quant_reference.TYPES[name].ggml_type for name, _ in parts]
    x = activations(5, 256)
    for path in (False, True):
        got = kernels.cpu.quant_linear(x, stored, types, int8=path)
        alone = [kernels.cpu.quant_linear(x, [s], [t], int8=path) for s, t in zip(stored, types, strict=True)]
        assert got.shape == (5, 40) and torch.equal(got, torch.cat(alone, dim=1))


def test_refuses_a_weight_that_does_not_fit_k() -> None:
    stored = weight("Q8_0", 4, 256)
    with pytest.raises(RuntimeError, match="bytes a row, not K = 512"):
        kernels.cpu.quant_linear(activations(2, 512), [stored], [quant_reference.TYPES["Q8_0"].ggml_type])
    with pytest.raises(RuntimeError, match="no quantized kernel for GGML type 6"):
        kernels.cpu.quant_linear(activations(2, 256), [stored], [6])
