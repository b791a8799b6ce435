"""Every bench imports: a bench that no test runs cannot rot at import unnoticed (a helper it took from
another bench renamed or deleted). Each is imported as ``python -m bench.NAME`` does."""

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("name", sorted(path.stem for path in BENCH.glob("*.py")))
def test_the_bench_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")
