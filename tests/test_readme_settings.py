"""README's settings table agrees with ``core/settings.py``: every setting is there, with its default."""

import re
from pathlib import Path
from typing import Any

from contract.engine import EngineConfig
from core.settings import Settings

REPO = Path(__file__).resolve().parent.parent
CODE = ("api", "contract", "core", "kernels", "pagedq", "worker")


def readme_table() -> dict[str, str]:
    """Each variable in README's configuration table, with its default cell's part for that variable."""
    section = (REPO / "README.md").read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
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


def test_the_worker_engine_has_the_engine_defaults() -> None:
    assert Settings.model_construct().engine_config() == EngineConfig()  # no PAGEDQ_* variables read
    config = Settings(max_num_seqs=3, block_size=32, model="/models/m").engine_config()
    assert (config.max_num_seqs, config.block_size, config.model) == (3, 32, "/models/m")
