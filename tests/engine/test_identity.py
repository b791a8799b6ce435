"""The model's content digest: over its weight files, computed once and cached beside them."""

from pathlib import Path

import pytest

from worker.engine.identity import CACHE, model_digest, tokenizer_digest

pytestmark = pytest.mark.fast


def test_the_model_digest_is_cached_beside_the_weights_until_they_change(tmp_path: Path) -> None:
    (tmp_path / "model-1.safetensors").write_bytes(b"one")
    (tmp_path / "model-2.safetensors").write_bytes(b"two")
    (tmp_path / "tokenizer.json").write_text("{}")
    first = model_digest(tmp_path)
    assert first.startswith("sha256:") and (tmp_path / CACHE).is_file()
    (tmp_path / "model-1.safetensors").unlink()  # the cache is keyed by the files: a change is seen
    (tmp_path / "model-1.safetensors").write_bytes(b"uno")
    second = model_digest(tmp_path)
    assert second != first and model_digest(tmp_path) == second
    (tmp_path / CACHE).write_text('{"files": [], "sha256": "sha256:stale"}')  # a cache of other files
    assert model_digest(tmp_path) == second
    assert tokenizer_digest(tmp_path) != model_digest(tmp_path)
