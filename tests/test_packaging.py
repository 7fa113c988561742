"""What the distribution installs: one package, ``agent_gateway``, and nothing a host can shadow.

The repository keeps the design card's folders (``gateway/``, ``hookspecs/``, ``plugins/``);
``setup.cfg`` maps them into ``agent_gateway``. These tests build the real wheel from a copy of
the checkout and start the real console script from a directory whose own ``gateway``,
``plugins``, ``hookspecs`` and ``contrib`` packages come first on ``sys.path``.
"""

from __future__ import annotations

import configparser
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest

from tests._cli import BUILT_INS, clean_env, run_cli, serve

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"gateway": "agent_gateway", "hookspecs": "agent_gateway/hookspecs", "plugins": "agent_gateway/plugins"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".peers", "node_modules"),
    )
    out = work / "out"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-input"]
    done = subprocess.run([*command, "-w", str(out), str(source)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    [built] = out.glob("agent_gateway-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {"agent_gateway", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, top
    assert not any(name.startswith(("gateway/", "plugins/", "hookspecs/", "contrib/")) for name in names)


def test_every_module_of_the_checkout_is_in_the_wheel(wheel: Path) -> None:
    """The package list in setup.cfg is explicit: a new subpackage left out of it fails here."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, installed_as in MAPPED.items():
        for path in (ROOT / folder).rglob("*"):
            # (vendored libraries ship their licences; `vendor/highlight.js` is a folder)
            licence = "vendor" in path.parts and path.name in ("LICENSE", "README.md")
            code = path.suffix in (".py", ".json", ".html", ".js", ".mjs", ".css") and "__pycache__" not in path.parts
            if path.is_file() and (code or licence):
                expected.add(f"{installed_as}/{path.relative_to(ROOT / folder).as_posix()}")
    expected.add("agent_gateway/py.typed")
    assert expected - names == set()


def test_entry_points_name_only_the_installed_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        [path] = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(path).decode())
    values = [value for section in parser.sections() for value in parser[section].values()]
    assert set(parser["agent_gateway"]) == BUILT_INS
    assert parser["pytest11"]["agent_gateway"] == "agent_gateway.testing.pytest_plugin"
    assert values and all(value.startswith("agent_gateway.") for value in values), values


def host_application(tmp_path: Path) -> Path:
    """A directory laid out like a host app that embeds the gateway: its own generic packages,
    each of which fails loudly if anything of ours imports it."""
    app = tmp_path / "host-app"
    for package in ("gateway", "plugins", "hookspecs", "contrib"):
        (app / package).mkdir(parents=True)
        failing = f"raise ImportError('the host app package {package} was imported')\n"
        (app / package / "__init__.py").write_text(failing)
    (app / "plugins" / "chat_only.py").write_text("raise ImportError('host plugins.chat_only')\n")
    return app


async def test_a_host_apps_own_packages_do_not_shadow_the_built_in_plugins(tmp_path: Path) -> None:
    app = host_application(tmp_path)
    env = clean_env(tmp_path, PYTHONPATH=str(app))
    rc, out, err = await run_cli("plugins", "--json", env=env, cwd=app)
    assert rc == 0, err
    assert {info["name"] for info in json.loads(out)} >= BUILT_INS

    # and a run goes through the chat-only plugin, served from that directory
    async with serve("--demo", "--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=app) as gw:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{gw.url}/v1/agents") as response:
                agents = {a["agentId"] for a in (await response.json())["agents"]}
    assert {"chat-only", "reasonix", "hermes", "pi-lab"} <= agents


def test_the_host_packages_really_are_first_on_the_path(tmp_path: Path) -> None:
    """The control for the test above: the host's packages are what a plain import finds."""
    app = host_application(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", "import plugins"], cwd=app, capture_output=True, text=True, timeout=60, check=False
    )
    assert "the host app package plugins was imported" in done.stderr
