"""README's settings table agrees with ``core/settings.py``: every setting is there, with its default."""

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from contract.engine import EngineConfig
from core.settings import Settings

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
CODE = ("api", "contract", "core", "kernels", "pagedq", "worker")


def readme_table(heading: str = "## Configuration") -> dict[str, str]:
    """Each variable in README's configuration tables (or in the one under ``heading``), with its default
    cell's part for that variable."""
    level = heading.split(" ", 1)[0]
    after = (REPO / "README.md").read_text().split(f"{heading}\n", 1)[1]
    section = re.split(rf"\n#{{1,{len(level)}}} ", after, maxsplit=1)[0]  # to the next heading as high
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `PAGEDQ_")]
    table = {}
    for names, defaults, *_ in rows:
        names_found = re.findall(r"`(PAGEDQ_[A-Z0-9_]+)`", names)
        parts = defaults.split(", ") if len(names_found) > 1 else [defaults]
        parts = parts if len(parts) == len(names_found) else parts[:1] * len(names_found)
        table.update(zip(names_found, parts, strict=True))
    return table


def written(default: Any) -> str | None:
    """A default as the README writes it, or None for one computed at run time (described in words)."""
    if default is None or default == "":
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float):
        return f"{default:g}"
    if isinstance(default, Path):
        return str(default).replace(str(Path.home()), "~", 1)
    return str(default)


def literal(cell: str) -> str | None:
    """The cell's literal default (`64`), or None where it describes one (`<data dir>/…`, timeout / 6)."""
    match = re.fullmatch(r"`([^`<]+)`", cell.strip())
    return match.group(1) if match and not match.group(1).startswith("PAGEDQ_") else None


def test_every_setting_is_in_the_readme_with_its_default() -> None:
    table = readme_table()
    for name, field in Settings.model_fields.items():
        variable = f"PAGEDQ_{name.upper()}"
        assert variable in table, f"{variable} is a setting but not in README's table"
        assert literal(table[variable]) == written(field.default), (variable, table[variable], field.default)


def test_every_readme_variable_is_read_somewhere() -> None:
    settings = {f"PAGEDQ_{name.upper()}" for name in Settings.model_fields}
    code = "\n".join(path.read_text() for part in CODE for path in (REPO / part).rglob("*.py"))
    for variable in readme_table().keys() - settings:
        read = f'"{variable}"' in code
        assert read, f"README documents {variable}, which nothing reads"


def test_the_engine_table_holds_every_engine_knob_and_only_those_settings() -> None:
    """``LLM(...)`` takes the engine table's settings as keywords (README says so)."""
    engine = {f"PAGEDQ_{knob.name.upper()}" for knob in fields(EngineConfig)}
    table = readme_table("### The engine").keys()
    assert engine <= table, f"engine settings missing from README's engine table: {engine - table}"
    settings = {f"PAGEDQ_{name.upper()}" for name in Settings.model_fields}
    assert not (table - engine) & settings, "a service setting in the engine table"


# A value other than the default for every engine knob, as the environment would give it.
ENGINE_VARIABLES = {
    "model": "/models/m",
    "dtype": "bfloat16",
    "quantization": "fp16",
    "gguf_kernel": "int8",
    "device": "cuda:1",
    "block_size": "32",
    "max_num_seqs": "3",
    "max_num_batched_tokens": "512",
    "max_model_len": "1024",
    "enable_prefix_caching": "false",
    "gpu_memory_utilization": "0.5",
    "kv_cache_bytes": "1048576",
    "load_format": "dummy",
    "enforce_eager": "true",
    "seed": "7",
    "batch_invariant": "false",
    "grammar_compile_timeout": "2.5",
}


def test_every_engine_knob_is_read_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ENGINE_VARIABLES.keys() == {knob.name for knob in fields(EngineConfig)}, "a knob without a value"
    for name, value in ENGINE_VARIABLES.items():
        monkeypatch.setenv(f"PAGEDQ_{name.upper()}", value)
    config, default = Settings().engine_config(), EngineConfig()
    for name, value in ENGINE_VARIABLES.items():
        assert getattr(config, name) != getattr(default, name), name
        assert str(getattr(config, name)).lower() == value, name


def test_the_worker_engine_has_the_engine_defaults() -> None:
    assert Settings.model_construct().engine_config() == EngineConfig()  # no PAGEDQ_* variables read
    config = Settings(max_num_seqs=3, block_size=32, model="/models/m").engine_config()
    assert (config.max_num_seqs, config.block_size, config.model) == (3, 32, "/models/m")
