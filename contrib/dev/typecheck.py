"""Type-check the typed contract with mypy: the public API, the hookspecs and the built-in plugins.

    python contrib/dev/typecheck.py [extra mypy arguments]

Checked (errors reported): ``agent_gateway`` and every module its ``__all__`` re-exports from
(read from ``_EXPORTS`` in ``gateway/__init__.py``), and the packages ``agent_gateway.hookspecs``,
``agent_gateway.plugins`` (every built-in plugin) and ``agent_gateway.testing``. The rest of the
core is followed for its types only (``follow_imports = silent`` in setup.cfg's ``[mypy]``
sections, which hold the whole configuration).

mypy finds packages by folder name and cannot follow setuptools' editable-install import hook,
while setup.cfg maps ``gateway/`` to ``agent_gateway`` (and ``hookspecs/``, ``plugins/`` below
it). So this script lays the installed layout out as symlinks in a temporary folder, from
setup.cfg's ``packages`` and ``package_dir``, runs mypy there, and prints mypy's report with the
checkout's own paths. The incremental cache is ``.mypy_cache/`` in the checkout. Exit status:
mypy's.
"""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "agent_gateway"
# Checked as whole packages (every module below them).
PACKAGES = (f"{PACKAGE}.hookspecs", f"{PACKAGE}.plugins", f"{PACKAGE}.testing")


def installed_layout(root: Path = ROOT) -> dict[str, Path]:
    """Each installed package (dotted name) -> the checkout folder it comes from (setup.cfg)."""
    parser = configparser.ConfigParser()
    parser.read(root / "setup.cfg")
    options = parser["options"]
    mapping: dict[str, str] = {}
    for line in options.get("package_dir", "").splitlines():
        if "=" in line:
            name, folder = (part.strip() for part in line.split("=", 1))
            mapping[name] = folder
    layout: dict[str, Path] = {}
    for package in options["packages"].split():
        base = max((name for name in mapping if package == name or package.startswith(name + ".")), key=len)
        rest = package[len(base) :].lstrip(".")
        layout[package] = root / mapping[base] / rest.replace(".", "/")
    return layout


def public_modules(root: Path = ROOT) -> list[str]:
    """``agent_gateway`` and the modules its public names come from (``_EXPORTS``)."""
    source = installed_layout(root)[PACKAGE] / "__init__.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets):
                exports = ast.literal_eval(node.value) if node.value is not None else {}
                return [PACKAGE, *sorted(set(exports.values()))]
    raise SystemExit(f"{source}: no _EXPORTS dictionary")


def link_tree(target: Path, layout: dict[str, Path]) -> None:
    """The installed layout under `target`: one folder per package, its modules as symlinks."""
    for package, folder in layout.items():
        here = target.joinpath(*package.split("."))
        here.mkdir(parents=True, exist_ok=True)
        for path in folder.iterdir():
            if path.suffix in (".py", ".pyi") or path.name == "py.typed":
                (here / path.name).symlink_to(path)


def run(extra: list[str]) -> int:
    layout = installed_layout()
    # longest first: a subpackage's folder is not necessarily below its parent's
    back = sorted(((package.replace(".", "/") + "/", folder) for package, folder in layout.items()), reverse=True)
    with tempfile.TemporaryDirectory(prefix="agw-typecheck-") as tmp:
        link_tree(Path(tmp), layout)
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg")]
        command += ["--cache-dir", str(ROOT / ".mypy_cache")]
        for module in public_modules():
            if not module.startswith(tuple(f"{package}." for package in PACKAGES)) and module not in PACKAGES:
                command += ["-m", module]
        for package in PACKAGES:
            command += ["-p", package]
        done = subprocess.run([*command, *extra], cwd=tmp, capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        path, colon, rest = line.partition(":")
        for prefix, folder in back:
            name = path[len(prefix) :]
            if colon and path.startswith(prefix) and "/" not in name:
                line = f"{(folder / name).relative_to(ROOT)}:{rest}"
                break
        print(line)
    return done.returncode


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
