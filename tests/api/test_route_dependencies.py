"""What every request resolves before its route runs: nothing of it hops to a thread."""

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from api.app import create_app
from api.http.auth import current_caller
from core.settings import Settings


def dependencies(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from dependencies(sub)


def runs_on_the_loop(call: Callable[..., Any]) -> bool:
    function = call if inspect.isfunction(call) or inspect.ismethod(call) else type(call).__call__
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


def test_every_dependency_of_every_route_runs_on_the_event_loop(service_settings: Settings) -> None:
    """FastAPI runs a plain function dependency in its threadpool: a thread hop on every request that
    resolves it, there and back (``get_service`` cost each accepted job one, bench/RESULTS.md, 2026-11-29,
    twenty-fifth session). A dependency that must block hands its work to a thread itself
    (``current_caller``)."""
    with TestClient(create_app(service_settings)) as client:
        contexts = iter_route_contexts(client.app.routes)  # type: ignore[attr-defined]
        routes = [(route.path, route.dependant) for route in contexts if hasattr(route, "dependant")]
        assert len(routes) > 20  # the app's own routes, not an empty list
        hopping = {
            f"{call.__module__}.{call.__qualname__} (for {path})"
            for path, dependant in routes
            for call in dependencies(dependant)
            if not runs_on_the_loop(call)
        }
        assert any(current_caller in dependencies(dependant) for _, dependant in routes)
    assert not hopping, hopping
