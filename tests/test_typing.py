"""The typed contract is checked: mypy passes over the public API, the hookspecs and the built-in
plugins (``contrib/dev/typecheck.py``, configured in setup.cfg's ``[mypy]`` sections)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TYPECHECK = Path("contrib", "dev", "typecheck.py")
UNTYPED = "\n\ndef _untyped(value):\n    return value\n"


def typecheck(root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert importlib.util.find_spec("mypy") is not None, "mypy is missing: pip install -e '.[test]'"
    command = [sys.executable, str(root / TYPECHECK)]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)


def the_script() -> Any:
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / TYPECHECK)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def module_paths() -> tuple[dict[str, Path], set[str]]:
    """Every installed module -> its file in the checkout; and the names the check covers."""
    script = the_script()
    layout: dict[str, Path] = script.installed_layout(ROOT)
    paths = {
        f"{name}.{path.stem}".removesuffix(".__init__"): path for name in layout for path in layout[name].glob("*.py")
    }
    covered = {name for name in paths if name.startswith(script.PACKAGES) or name in script.PACKAGES}
    covered |= set(script.public_modules(ROOT))
    return paths, covered


def test_mypy_passes_over_the_public_api_the_hookspecs_and_the_plugins(tmp_path: Path) -> None:
    # from another folder: the script finds the checkout from its own path, not the working directory
    done = typecheck(ROOT, tmp_path)
    assert done.returncode == 0, f"mypy found problems (python {TYPECHECK}):\n{done.stdout}{done.stderr}"
    checked = re.search(r"no issues found in (\d+) source files", done.stdout)
    assert checked, done.stdout
    _, covered = module_paths()
    assert int(checked.group(1)) == len(covered), sorted(covered)


@pytest.fixture
def checkout_copy(tmp_path: Path) -> Path:
    """What the type check reads of the checkout, in a temporary folder."""
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.json", "console")
    for folder in ("gateway", "hookspecs", "plugins"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=ignore)
    (copy / TYPECHECK.parent).mkdir(parents=True)
    shutil.copy(ROOT / TYPECHECK, copy / TYPECHECK)
    shutil.copy(ROOT / "setup.cfg", copy / "setup.cfg")
    # mypy's cache, warm if the other test ran first: its SQLite files through SQLite's backup,
    # a consistent copy even while the other test writes them
    for path in (ROOT / ".mypy_cache").rglob("*"):
        target = copy / path.relative_to(ROOT)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.suffix == ".db":
            with closing(sqlite3.connect(path)) as source, closing(sqlite3.connect(target)) as into:
                source.backup(into)
    return copy


def test_an_untyped_function_in_a_plugin_a_hookspec_or_a_public_module_fails(checkout_copy: Path) -> None:
    """Errors are reported at the checkout's own paths; an internal core module is read for its
    types only, so its own errors are not this check's."""
    paths, covered = module_paths()
    public = the_script().public_modules(ROOT)[1]
    internal = min(n for n in paths if n.count(".") == 1 and n not in covered and not n.endswith("__"))
    checked = [paths[name] for name in ("agent_gateway.hookspecs", "agent_gateway.plugins.otel", public)]
    for path in [*checked, paths[internal]]:
        with (checkout_copy / path.relative_to(ROOT)).open("a") as source:
            source.write(UNTYPED)
    done = typecheck(checkout_copy, checkout_copy)
    assert done.returncode == 1, done.stdout
    reported = {line.split(":")[0] for line in done.stdout.splitlines() if "[no-untyped-def]" in line}
    assert reported == {str(path.relative_to(ROOT)) for path in checked}, done.stdout
