"""The public API is one import, and the package has no import cycles.

- Every built-in plugin (``plugins/``) and the example third-party plugin
  (``contrib/example-runtime-plugin/``) imports the gateway only as ``agent_gateway`` (its
  ``__all__``), never an internal module such as ``agent_gateway.app`` or
  ``agent_gateway.preferences``. (Test modules of a plugin may also use ``agent_gateway.testing``,
  the plugin authors' test kit.)
- Every name in ``agent_gateway.__all__`` resolves.
- The modules of ``gateway/``, ``hookspecs/`` and ``plugins/`` import each other without a cycle at
  module level (imports under ``if TYPE_CHECKING:`` are for type checkers and do not count).
"""

from __future__ import annotations

import ast
from pathlib import Path

import agent_gateway

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_TREES = (ROOT / "plugins", ROOT / "contrib" / "example-runtime-plugin")
TEST_KIT = "agent_gateway.testing"
# How the repository's folders install (setup.cfg package_dir).
PACKAGE_DIRS = {
    "agent_gateway": ROOT / "gateway",
    "agent_gateway.hookspecs": ROOT / "hookspecs",
    "agent_gateway.plugins": ROOT / "plugins",
}


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """Every absolute module name a file imports, anywhere in it (``from X import y`` also counts
    ``X.y``, which may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def is_internal(module: str, in_tests: bool) -> bool:
    if module == "agent_gateway" or not module.startswith("agent_gateway."):
        return False
    if module.rsplit(".", 1)[0] == "agent_gateway" and module.rsplit(".", 1)[1] in agent_gateway.__all__:
        return False  # `from agent_gateway import Name`, seen as agent_gateway.Name
    return not (in_tests and (module == TEST_KIT or module.startswith(TEST_KIT + ".")))


def test_plugins_import_only_the_public_api() -> None:
    offences = []
    files = [path for tree in PLUGIN_TREES for path in sorted(tree.rglob("*.py"))]
    assert len(files) > 20, files  # the trees are where this test thinks they are
    for path in files:
        relative = path.relative_to(ROOT)
        in_tests = "tests" in relative.parts or path.name.startswith(("test_", "conftest"))
        for line, module in imported_modules(ast.parse(path.read_text(encoding="utf-8"))):
            if is_internal(module, in_tests):
                offences.append(f"{relative}:{line}: imports {module}")
    assert not offences, "plugins import only `agent_gateway`:\n" + "\n".join(offences)


def test_the_check_catches_internal_imports() -> None:
    tree = ast.parse("from agent_gateway.app import GATEWAY_KEY\nimport agent_gateway.preferences\n")
    flagged = [module for _, module in imported_modules(tree) if is_internal(module, in_tests=False)]
    assert flagged == ["agent_gateway.app", "agent_gateway.app.GATEWAY_KEY", "agent_gateway.preferences"]
    public = ast.parse("from agent_gateway import PluginRoutes, hookimpl\n")
    assert not [m for _, m in imported_modules(public) if is_internal(m, in_tests=False)]


def test_every_public_name_resolves() -> None:
    for name in agent_gateway.__all__:
        assert getattr(agent_gateway, name) is not None, name
    assert set(agent_gateway.__all__) - {"__version__"} == set(agent_gateway._EXPORTS)
    assert "PluginRoutes" in agent_gateway.__all__


# -- import cycles ------------------------------------------------------------------------------------


def package_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for prefix, base in PACKAGE_DIRS.items():
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([prefix, *parts])] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not inside functions or classes, not under
    ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += top_level_imports(node.body)
            found += top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            found += top_level_imports(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                found += top_level_imports(handler.body)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges: set[str] = set()
        for node in top_level_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in modules}
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target in modules:
                edges.add(target)
            edges |= {f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules}
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_at_module_level() -> None:
    graph = import_graph()
    assert {"agent_gateway.app", "agent_gateway.routes.runs", "agent_gateway.hookspecs.routes"} <= set(graph)
    assert "agent_gateway.routes.runs" in graph["agent_gateway.app"]  # the graph has the edges
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
