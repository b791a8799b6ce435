"""The torch de-quantizers (kernels/quant_reference.py) and the GGUF reader (worker/engine/model/
gguf_file.py) against the ``gguf`` package's de-quantization, on files written in the test."""

from pathlib import Path

import numpy as np
import pytest
import torch

from kernels import quant_reference
from tests.support.gguf_files import decode, encode, write_gguf
from worker.engine.model.gguf_file import GGUFError, GGUFFile

ALL_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32"]


def stored_tensors(rng: np.random.Generator, rows: int = 6, cols: int = 512) -> dict:
    return {
        f"t.{name}": (name, encode(rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32), name, rng))
        for name in ALL_TYPES
    }


@pytest.mark.fast
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_reader_keeps_blocks_and_dequantizes_as_gguf_does(tmp_path: Path, type_name: str) -> None:
    rng = np.random.default_rng(0)
    tensors = stored_tensors(rng)
    file = GGUFFile.open(write_gguf(tmp_path / "t.gguf", tensors))
    tensor = file.tensors[f"t.{type_name}"]
    stored = tensors[f"t.{type_name}"][1]
    assert tensor.shape == (6, 512) and tensor.type.name == type_name
    if type_name not in quant_reference.FLOAT_DTYPES:
        assert tensor.data.dtype == torch.uint8
        assert np.array_equal(tensor.data.numpy(), stored)  # the blocks as they are, not a conversion
    want = decode(stored, type_name)
    assert np.isfinite(want).all()
    assert torch.equal(tensor.dequantize(), torch.from_numpy(want))  # bit for bit


@pytest.mark.fast
def test_reader_maps_the_file_and_reads_metadata(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = write_gguf(tmp_path / "t.gguf", stored_tensors(rng), block_count=3, embedding_length=512)
    file = GGUFFile.open(path)
    assert file.architecture == "llama"
    assert file.metadata["llama.block_count"] == 3
    assert file.tensors["t.Q8_0"].nbytes == 6 * 512 // 32 * 34


@pytest.mark.fast
def test_linear_reference_equals_dequantize_then_matmul() -> None:
    rng = np.random.default_rng(2)
    stored = torch.from_numpy(encode(rng.normal(0, 0.05, size=(40, 256)).astype(np.float32), "Q4_K", rng))
    x = torch.randn(3, 256)
    want = x @ quant_reference.dequantize(stored, "Q4_K").T
    assert torch.allclose(quant_reference.linear(x, stored, "Q4_K", rows_per_chunk=16), want, atol=1e-6)


@pytest.mark.fast
def test_unsupported_type_names_the_tensor_and_the_supported_types(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType, quants

    q5 = quants.quantize(np.zeros((2, 64), dtype=np.float32), GGMLQuantizationType.Q5_0)
    write_gguf(tmp_path / "q5.gguf", {"blk.0.ffn_up.weight": ("Q5_0", q5)})
    with pytest.raises(
        GGUFError, match=r"'blk.0.ffn_up.weight' has GGML type Q5_0.*supported: F32, F16, Q4_0"
    ):
        GGUFFile.open(tmp_path / "q5.gguf")


@pytest.mark.fast
def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    path = write_gguf(tmp_path / "t.gguf", stored_tensors(rng))
    data = path.read_bytes()
    path.write_bytes(data[:-200])
    with pytest.raises(GGUFError, match=r"tensor 't.F32' \(F32, \[6, 512\]\).*truncated"):
        GGUFFile.open(path)
    path.write_bytes(data[:100])
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        GGUFFile.open(path)
    path.write_bytes(b"GGML" + data[4:])
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        GGUFFile.open(path)
