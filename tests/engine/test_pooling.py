"""Reading a model's pooling from its sentence-transformers files, and pooling a packed batch."""

import json
from pathlib import Path

import pytest
import torch

from contract.pooling_files import read_pooling
from tests.support.tiny_models import write_sentence_transformers_files
from worker.engine.pooling import finish, pool

pytestmark = pytest.mark.fast

HF = {"hidden_size": 8, "max_position_embeddings": 512}


@pytest.mark.parametrize(("mode", "normalize"), [("mean", True), ("cls", False), ("last", True)])
def test_reads_modules_json_and_the_pooling_config(tmp_path: Path, mode: str, normalize: bool) -> None:
    write_sentence_transformers_files(tmp_path, mode, normalize, hidden_size=8, max_seq_length=128)
    pooling = read_pooling(tmp_path, HF, default_mode="cls")
    assert (pooling.mode, pooling.normalize, pooling.max_seq_length, pooling.hidden_size) == (
        mode,
        normalize,
        128,
        8,
    )


def test_max_seq_length_defaults_to_and_is_capped_by_the_context(tmp_path: Path) -> None:
    write_sentence_transformers_files(tmp_path, "mean", True, hidden_size=8, max_seq_length=None)
    assert read_pooling(tmp_path, HF, "cls").max_seq_length == 512
    write_sentence_transformers_files(tmp_path, "mean", True, hidden_size=8, max_seq_length=4096)
    assert read_pooling(tmp_path, HF, "cls").max_seq_length == 512


def test_without_modules_json_pools_the_default_mode_normalized(tmp_path: Path) -> None:
    pooling = read_pooling(tmp_path, HF | {"matryoshka_dimensions": [8, 4, 2]}, default_mode="last")
    assert (pooling.mode, pooling.normalize, pooling.dimensions) == ("last", True, (4, 2))


def test_newer_single_key_pooling_config(tmp_path: Path) -> None:
    write_sentence_transformers_files(tmp_path, "mean", False, hidden_size=8, max_seq_length=None)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "lasttoken"}))
    assert read_pooling(tmp_path, HF, "cls").mode == "last"


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"pooling_mode_max_tokens": True}, "not supported"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "exactly one"),
        ({}, "exactly one"),
        ({"pooling_mode": "weightedmean"}, "not supported"),
    ],
)
def test_unsupported_pooling_is_refused(tmp_path: Path, config: dict, match: str) -> None:
    write_sentence_transformers_files(tmp_path, "mean", False, hidden_size=8, max_seq_length=None)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        read_pooling(tmp_path, HF, "cls")


def test_unknown_modules_are_refused(tmp_path: Path) -> None:
    write_sentence_transformers_files(tmp_path, "mean", True, hidden_size=8, max_seq_length=None)
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"\['Dense'\] are not supported"):
        read_pooling(tmp_path, HF, "cls")


def test_pool_matches_a_loop_over_inputs() -> None:
    lens = [3, 1, 5, 2]
    hidden = torch.randn(sum(lens), 8)
    parts = hidden.split(lens)
    torch.testing.assert_close(pool(hidden, lens, "mean"), torch.stack([p.mean(0) for p in parts]))
    assert torch.equal(pool(hidden, lens, "cls"), torch.stack([p[0] for p in parts]))
    assert torch.equal(pool(hidden, lens, "last"), torch.stack([p[-1] for p in parts]))


def test_finish_cuts_then_normalizes() -> None:
    vectors = torch.tensor([[3.0, 4.0, 12.0]])
    torch.testing.assert_close(finish(vectors, True, None), torch.tensor([[3.0, 4.0, 12.0]]) / 13)
    torch.testing.assert_close(finish(vectors, True, 2), torch.tensor([[0.6, 0.8]]))
    assert torch.equal(finish(vectors, False, 2), torch.tensor([[3.0, 4.0]]))
