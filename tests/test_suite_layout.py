"""The suite's own layout rules, so its harness stays one: a test module imports helper modules
(``tests/_*.py``, ``agent_gateway.testing``) and never another test module nor ``conftest``
(pytest loads that itself; a second import would be a second copy of its globals), and helper
modules are imported one way only, as ``tests._name``."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement of `path` names (``from tests import x`` names ``tests.x``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "tests":
                found.extend((node.lineno, f"tests.{alias.name}") for alias in node.names)
    return found


def test_no_test_module_imports_another_or_conftest() -> None:
    local = {path.stem for path in TESTS.glob("*.py")}
    problems = []
    for path in sorted(TESTS.glob("*.py")):
        for line, module in imported_modules(path):
            last = module.split(".")[-1]
            if module.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                problems.append(f"{path.name}:{line} imports {module}")
            elif module in local:  # `import _harness` or `from test_cli import ...`: the bare name
                problems.append(f"{path.name}:{line} imports {module} (write tests.{module}, a helper module)")
    assert not problems, "\n".join(problems)


def test_helper_modules_hold_no_tests() -> None:
    """A test in a helper module would run once per module importing it."""
    for path in sorted(TESTS.glob("_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tests = [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and node.name.lower().startswith("test")
        ]
        assert not tests, f"{path.name} defines {tests}"
