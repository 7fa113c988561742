"""The installed package's modules import each other without a cycle, counting every import: at
module level, inside functions, and under ``if TYPE_CHECKING:`` (a type-only cycle still ties the
modules together for a reader and a type checker). ``agent_gateway.app`` is the one composition
root: only the launcher and the test kit import it.

The graph is read with :mod:`ast` from the files of the installed ``agent_gateway``,
``agent_gateway.hookspecs`` and ``agent_gateway.plugins`` packages. ``from package import name``
counts ``package.name`` when that is a module, else ``package``; importing a submodule is not
counted as importing its parent package (``__init__``)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGES = ("agent_gateway", "agent_gateway.hookspecs", "agent_gateway.plugins")
# Above the application: what builds and serves a gateway (the launcher, the plugin authors' kit).
COMPOSITION_ROOT = "agent_gateway.app"
MAY_IMPORT_ROOT = ("agent_gateway.cli", "agent_gateway.__main__", "agent_gateway.testing")


def installed_modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name, to its file."""
    modules: dict[str, Path] = {}

    def walk(package: str, folder: Path) -> None:
        modules[package] = folder / "__init__.py"
        for path in sorted(folder.iterdir()):
            if path.suffix == ".py" and path.name != "__init__.py":
                modules[f"{package}.{path.stem}"] = path
            elif path.is_dir() and (path / "__init__.py").is_file():
                walk(f"{package}.{path.name}", path)

    for package in PACKAGES:
        if package in modules:
            continue
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed"
        for location in spec.submodule_search_locations:
            walk(package, Path(location))
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` is, or the nearest package of ours that holds it (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = installed_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(o for alias in node.names if (o := _owner(alias.name, modules)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package, one level up per extra dot
                    parent = package
                    for _ in range(node.level - 1):
                        parent = parent.rpartition(".")[0]
                    base = f"{parent}.{base}" if base else parent
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    owner = target if target in modules else _owner(base, modules)
                    if owner:
                        found.add(owner)
        found.discard(module)
        graph[module] = found
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None. Iterative depth-first search (bounded by
    the graph's size)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            advanced = False
            for nxt in stack[-1]:
                if state.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if not state.get(nxt):
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(sorted(graph.get(nxt, ()))))
                    advanced = True
                    break
            if not advanced:
                state[path.pop()] = 2
                stack.pop()
    return None


def test_the_graph_is_read_from_the_installed_packages() -> None:
    graph = import_graph()
    assert {"agent_gateway.app", "agent_gateway.hookspecs.routes", "agent_gateway.plugins.cluster_redis"} <= set(graph)
    # A type-only import and a function-local one are edges.
    assert "agent_gateway.runs" in graph["agent_gateway.plugin_routes"]  # under TYPE_CHECKING
    assert "agent_gateway.app" in graph["agent_gateway.cli"]


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_reports_the_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_launcher_and_the_test_kit_import_the_composition_root() -> None:
    importers = sorted(m for m, deps in import_graph().items() if COMPOSITION_ROOT in deps)
    below = [m for m in importers if not m.startswith(MAY_IMPORT_ROOT)]
    assert below == [], f"modules below the application import {COMPOSITION_ROOT}: {below}"
