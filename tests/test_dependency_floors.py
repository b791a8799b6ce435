"""The declared floor of FastAPI is at least the release that brought every FastAPI module the product
imports: a lower floor would let pip install a FastAPI the service cannot import."""

import re
import tomllib
from pathlib import Path

import pytest

from tests.test_import_graph import imported_names, product_modules

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
# Each FastAPI module the product imports, and the first release that has it (FastAPI's release notes):
# a module imported for the first time needs a line here, checked against those notes.
FASTAPI_SINCE = {
    "fastapi": (0, 115),  # the oldest floor pagedq ever declared; everything imported from the top is older
    "fastapi.exception_handlers": (0, 115),
    "fastapi.exceptions": (0, 115),
    "fastapi.responses": (0, 115),
    "fastapi.staticfiles": (0, 115),
    "fastapi.sse": (0, 135),  # 0.135.0: "Add support for Server Sent Events" (EventSourceResponse, ...)
}


def declared_floor(package: str) -> tuple[int, ...]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in dependencies:
        if match := re.fullmatch(rf"{package}(\[[^]]*\])?>=([0-9.]+)(,.*)?", requirement.replace(" ", "")):
            return tuple(int(part) for part in match.group(2).split("."))
    raise AssertionError(f"pyproject.toml declares no floor for {package}")


def fastapi_modules_imported() -> set[str]:
    names = {name for module in product_modules().values() for name in imported_names(module)}
    modules = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == "fastapi":
            # ``from fastapi.sse import X`` gives fastapi.sse.X: the module is the longest known prefix
            modules.add(next((m for m in _prefixes(parts) if m in FASTAPI_SINCE), ".".join(parts[:2])))
    return modules


def _prefixes(parts: list[str]) -> list[str]:
    return [".".join(parts[:end]) for end in range(len(parts), 0, -1)]


def test_every_fastapi_module_imported_is_dated() -> None:
    undated = fastapi_modules_imported() - set(FASTAPI_SINCE)
    assert not undated, f"add to FASTAPI_SINCE the release that brought {sorted(undated)}"


def test_the_fastapi_floor_has_every_module_imported() -> None:
    imported = fastapi_modules_imported()
    assert "fastapi.sse" in imported  # the reason for the floor, while the streams use it
    needed = max(FASTAPI_SINCE[module] for module in imported if module in FASTAPI_SINCE)
    assert declared_floor("fastapi") >= needed, f"pyproject.toml: fastapi>={'.'.join(map(str, needed))}"


def test_the_floor_reader_reads_past_extras() -> None:
    assert declared_floor("uvicorn") >= (0, 30)  # uvicorn[standard]>=0.30
