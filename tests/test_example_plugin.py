"""The example third-party runtime plugin (contrib/example-runtime-plugin), installed with pip the
way an integrator installs a plugin, and found by the gateway through its entry point alone.

How it is installed: a real, non-editable `pip install --no-deps --target DIR` of the
distribution, built from a copy of its source (so the repository stays clean). DIR is put on
PYTHONPATH of the `agent-gateway` subprocesses only: `importlib.metadata` sees the distribution's
`*.dist-info/entry_points.txt` there exactly as it would in site-packages, while the shared test
environment is left untouched (nothing to uninstall; every run starts from a fresh temporary dir,
so the test is idempotent). The gateway process is started through the installed console script
and never imports the plugin by name: if the entry point were wrong, `example-upper` would not
exist.

pip runs with `--no-build-isolation` when the environment can build a wheel offline (the `wheel`
package, or setuptools >= 70.1 which ships `bdist_wheel`); otherwise it lets pip fetch the build
requirements from the configured index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata, util
from pathlib import Path

import aiohttp
import pytest
from conftest import sse_events
from test_cli import clean_env, run_cli, serve

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "contrib" / "example-runtime-plugin"
DIST = "agent-gateway-example-runtime"


def can_build_offline() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    if util.find_spec("wheel") is not None:
        return True
    major, minor = (int(part) for part in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory holding the pip-installed example distribution."""
    work = tmp_path_factory.mktemp("example-plugin")
    source = work / "src"
    shutil.copytree(SOURCE, source, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    site = work / "site"
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check"]
    if can_build_offline():
        command.append("--no-build-isolation")
    command += ["--target", str(site), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    [dist_info] = site.glob("agent_gateway_example_runtime-*.dist-info")
    assert "example_upper = agent_gateway_example" in (dist_info / "entry_points.txt").read_text()
    yield site
    shutil.rmtree(work, ignore_errors=True)


def env_with(site: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = clean_env(tmp_path, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return env


def installed_in_this_environment() -> bool:
    try:
        metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return False
    return True


async def test_plugins_lists_the_example_distribution(plugin_site: Path, tmp_path: Path) -> None:
    rc, out, err = await run_cli("plugins", "--json", env=env_with(plugin_site, tmp_path), cwd=tmp_path)
    assert rc == 0, err
    infos = {info["name"]: info for info in json.loads(out)}
    example = infos["example_upper"]
    assert (example["distribution"], example["version"]) == (DIST, "0.1.0")
    assert example["hooks"] == ["config_sections", "register_runtimes"]
    assert infos["core"]["distribution"] == "agent-gateway"

    rc, out, _ = await run_cli("plugins", env=env_with(plugin_site, tmp_path), cwd=tmp_path)
    assert rc == 0 and f"example_upper    {DIST} 0.1.0" in out, out

    if not installed_in_this_environment():  # the control: without the install, no plugin
        rc, out, _ = await run_cli("plugins", "--json", env=clean_env(tmp_path), cwd=tmp_path)
        assert rc == 0 and "example_upper" not in {info["name"] for info in json.loads(out)}


async def test_a_run_goes_through_the_installed_plugin(plugin_site: Path, tmp_path: Path) -> None:
    env = env_with(plugin_site, tmp_path, AGENT_GATEWAY__EXAMPLE_UPPER__PREFIX='"> "')
    async with serve("--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path) as gw:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{gw.url}/v1/agents") as response:
                agents = {a["agentId"]: a for a in (await response.json())["agents"]}
            assert agents["example-upper"]["displayName"] == "Example: upper-case echo"
            assert agents["example-upper"]["provider"] == "example"

            body = {"requestId": "r-1", "agentId": "example-upper", "sessionId": "s-1", "message": "hello plugin"}
            async with http.post(f"{gw.url}/v1/runs", json=body) as response:
                assert response.status == 201, await response.text()
                receipt = await response.json()
            async with http.get(
                f"{gw.url}/v1/runs/{receipt['hostRunId']}/stream", timeout=aiohttp.ClientTimeout(total=30)
            ) as response:
                events = [e async for e in sse_events(response)]
            async with http.get(f"{gw.url}/v1/runs/{receipt['hostRunId']}") as response:
                final = await response.json()

        kinds = [e["event"] for e in events]
        assert kinds[0] == "run.created" and kinds[-1] == "run.completed", kinds
        deltas = [e["data"]["payload"]["text"] for e in events if e["event"] == "message.delta"]
        assert "".join(deltas) == "> HELLO PLUGIN"
        assert deltas == ["> HE", "LLO ", "PLUG", "IN"]  # chunk_size 4 from the plugin's defaults
        [completed] = [e["data"]["payload"] for e in events if e["event"] == "message.completed"]
        assert completed == {"text": "> HELLO PLUGIN"}
        assert {e["data"]["source"] for e in events if e["event"].startswith("message.")} == {"example-upper"}
        assert (final["status"], final["provider"]) == ("completed", "example")

        # And from the terminal, as the README shows.
        rc, out, err = await run_cli(
            "runs", "send", "--url", gw.url, "--agent", "example-upper", "again", env=env, cwd=tmp_path
        )
        assert rc == 0, err
        assert "> AGAIN" in out and "[run.completed]" in out


async def test_config_check_knows_the_plugins_section(plugin_site: Path, tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text("[example_upper]\nprefix = 3\nchunk_size = 0\n")
    rc, out, _ = await run_cli(
        "config", "check", "--config", str(config), env=env_with(plugin_site, tmp_path), cwd=tmp_path
    )
    assert rc == 1
    assert out.splitlines() == [
        f"{config}: example_upper.prefix: expected str, got int",
        f"{config}: example_upper.chunk_size: must be positive",
    ]
    config.write_text('[example_upper]\nprefix = ">> "\nchunk_size = 2\n')
    rc, out, _ = await run_cli(
        "config", "check", "--config", str(config), env=env_with(plugin_site, tmp_path), cwd=tmp_path
    )
    assert (rc, out) == (0, f"{config}: ok\n")

    if not installed_in_this_environment():  # without the plugin, its section is unknown
        rc, out, _ = await run_cli("config", "check", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
        assert rc == 1 and f"{config}: example_upper: unknown section" in out


async def test_load_plugins_env_can_leave_the_plugin_out(plugin_site: Path, tmp_path: Path) -> None:
    env = env_with(plugin_site, tmp_path, AGENT_GATEWAY_LOAD_PLUGINS="some_other_plugin")
    rc, out, err = await run_cli("plugins", "--json", env=env, cwd=tmp_path)
    assert rc == 0, err
    names = {info["name"] for info in json.loads(out)}
    assert "example_upper" not in names and {"chat_only", "core", "journal_peewee"} <= names  # built-ins stay
