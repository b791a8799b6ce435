"""Imports point one way: api/ → core/ ← worker/ → worker/engine/ → kernels/."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]

# package → top-level modules it must never import
FORBIDDEN = {
    "core": {"api", "worker", "kernels", "pagedq", "torch", "fastapi"},
    "api": {"worker", "kernels", "pagedq", "torch"},
    "worker/engine": {"core", "api", "pagedq", "sqlalchemy", "celery", "fastapi", "redis", "psycopg"},
    "kernels": {"core", "api", "worker", "pagedq", "sqlalchemy", "celery", "fastapi"},
    "migrations": {"api", "worker", "kernels", "pagedq"},
}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def outside_the_engine(package: str, name: str) -> bool:
    return package == "worker/engine" and name.startswith("worker.") and not name.startswith("worker.engine")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files
    violations = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if name.split(".")[0] in FORBIDDEN[package] or outside_the_engine(package, name)
    ]
    assert violations == []
