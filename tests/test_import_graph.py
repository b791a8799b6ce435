"""The product's import graph, read from the source with ``ast``: no import circles, the layers'
boundaries, and no class grown past 20 methods.

Every import counts: at the top of a module, under ``if TYPE_CHECKING:`` and inside a function alike, since
each says that one module needs the other, whether or not Python runs it at import time. An edge goes to
the most specific product module named (``from api.jobs import queries`` is an edge to
``api.jobs.queries``); third-party imports are kept only for the boundary checks.
"""

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("api", "contract", "core", "kernels", "pagedq", "worker")
MAX_METHODS = 20

# Import circles that are known and being removed elsewhere, by name: the lead empties this once the fix
# has landed (test_known_cycles_still_exist says when). Every other circle fails the test.
KNOWN_CYCLES: dict[str, frozenset[str]] = {}
ENGINE_MUST_NOT_IMPORT = ("sqlalchemy", "fastapi", "starlette", "celery", "core.db")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def product_modules() -> dict[str, Module]:
    modules = {}
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return modules


def imported_names(module: Module) -> Iterator[str]:
    """Every dotted name the module imports, anywhere in it: ``from a.b import c`` gives ``a.b.c``, which
    is module ``a.b.c`` or a name in module ``a.b`` (``_known`` tells)."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (base if alias.name == "*" else f"{base}.{alias.name}" for alias in node.names)


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, module in modules.items():
        targets = {_known(imported, modules) for imported in imported_names(module)}
        graph[name] = {target for target in targets if target is not None and target != name}
    return graph


def _known(imported: str, modules: dict[str, Module]) -> str | None:
    """The most specific product module an imported name is in, or None (not product code)."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:end])) in modules:
            return candidate
    return None


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components with more than one module (an edge to itself is dropped when built)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One circle through a component, as the path of modules from its first module back to it."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth first inside the component, until an edge closes back to start
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if target not in parents:
                    parents[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def _allowed(component: set[str]) -> bool:
    return any(component <= known for known in KNOWN_CYCLES.values())


def test_no_import_cycles_among_product_modules() -> None:
    graph = import_graph(product_modules())
    cycles = [cycle_path(graph, c) for c in strongly_connected(graph) if not _allowed(c)]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(path) for path in cycles)


def test_known_cycles_still_exist() -> None:
    """A circle fixed elsewhere leaves KNOWN_CYCLES: an allowance nobody needs would hide a new one."""
    components = strongly_connected(import_graph(product_modules()))
    for why, known in KNOWN_CYCLES.items():
        assert any(component <= known for component in components), (
            f"the known cycle {why!r} ({sorted(known)}) is gone: remove it from KNOWN_CYCLES"
        )


def test_the_graph_sees_type_only_and_function_local_imports() -> None:
    """The checks above would pass vacuously if the graph missed the imports that matter most here."""
    modules = product_modules()
    graph = import_graph(modules)
    assert "api.deps" in graph["api.http.auth"]  # current_caller's service dependency
    function_local = "pagedq.serve"  # imports the app inside a function, so `pagedq` starts fast
    assert "api.app" in graph[function_local]
    probe = Module(
        "probe.module",
        ROOT / "probe" / "module.py",
        ast.parse(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api.deps import Service\n"
            "def f():\n    from . import sibling\n"
        ),
    )
    assert {"api.deps.Service", "probe.sibling"} <= set(imported_names(probe))
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycle_path({"a": {"b"}, "b": {"c"}, "c": {"a"}}, {"a", "b", "c"}) == ["a", "b", "c", "a"]


def test_api_never_imports_the_worker() -> None:
    modules = product_modules()
    wrong = {
        (name, imported)
        for name, module in modules.items()
        if name.split(".")[0] == "api"
        for imported in imported_names(module)
        if imported.split(".")[0] == "worker"
    }
    assert not wrong, f"api/ imports worker/ (jobs travel by task name): {sorted(wrong)}"


def test_the_engine_knows_nothing_of_http_sql_or_celery() -> None:
    modules = product_modules()
    wrong = {
        (name, imported)
        for name, module in modules.items()
        if name.startswith("worker.engine")
        for imported in imported_names(module)
        if any(imported == banned or imported.startswith(f"{banned}.") for banned in ENGINE_MUST_NOT_IMPORT)
    }
    assert not wrong, f"worker/engine imports {ENGINE_MUST_NOT_IMPORT}: {sorted(wrong)}"


def test_no_class_has_more_than_twenty_methods() -> None:
    large = []
    for module in product_modules().values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > MAX_METHODS:
                    large.append(f"{module.name}.{node.name}: {len(methods)} methods")
    assert not large, f"classes over {MAX_METHODS} methods (split them by role): {large}"
