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

The example also carries its own tests (`contrib/example-runtime-plugin/tests`), written only
against the fixtures agent-gateway installs for pytest (`agent_gateway.testing`). They run here in
a fresh virtualenv where agent-gateway (built from a copy of this checkout) and the example are
really installed, non-editable, as a plugin author's CI would have them. To stay within CI's time
and work offline, the venv gets no packages from an index: a `.pth` file puts this interpreter's
site-packages after the venv's own (the gateway's dependencies and pytest come from there), and
both distributions are installed with `--no-deps`. Only the venv's copies of `agent_gateway` and
`agent_gateway_example` are importable there (asserted), and the tests must pass.
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

from tests._cli import clean_env, run_cli, serve
from tests._harness import sse_events

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


# -- the example's own tests, in a fresh virtualenv --------------------------------------------------

COPY_IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".peers", "node_modules", ".pytest_cache", ".venv"
)


def dependency_dirs() -> list[str]:
    """This interpreter's site-packages: where the gateway's dependencies and pytest are installed."""
    dirs = [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages") and Path(path).is_dir()]
    assert dirs, sys.path
    return dirs


def isolated_env(tmp_path: Path) -> dict[str, str]:
    """No PYTHONPATH, virtualenv or pytest settings from the outer run."""
    env = clean_env(tmp_path)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_PLUGINS"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(venv dir, the example's source copy): a new virtualenv with agent-gateway and the
    example installed (non-editable) from copies of the sources."""
    work = tmp_path_factory.mktemp("fresh-venv")
    gateway_source, example_source = work / "agent-gateway", work / "example"
    shutil.copytree(ROOT, gateway_source, ignore=COPY_IGNORE)
    shutil.copytree(SOURCE, example_source, ignore=COPY_IGNORE)
    venv = work / "venv"
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    env = isolated_env(work)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    ).stdout.strip()
    assert Path(purelib).is_relative_to(venv), purelib
    (Path(purelib) / "_outer_dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")

    command = [str(python), "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-input"]
    command += ["--disable-pip-version-check"]
    if can_build_offline():
        command += ["--no-build-isolation", "--no-index"]
    installed = subprocess.run(
        [*command, str(gateway_source), str(example_source)], capture_output=True, text=True, timeout=300, env=env
    )
    assert installed.returncode == 0, f"pip install failed:\n{installed.stdout}\n{installed.stderr}"
    yield venv, example_source
    shutil.rmtree(work, ignore_errors=True)


def test_the_examples_own_tests_pass_in_a_fresh_venv(fresh_venv: tuple[Path, Path], tmp_path: Path) -> None:
    venv, example_source = fresh_venv
    python = str(venv / "bin" / "python")
    env = isolated_env(tmp_path)

    # What the tests will import is the venv's installed copy, not this checkout.
    probe = "import agent_gateway, agent_gateway_example, agent_gateway.testing.pytest_plugin as p; "
    probe += "print(agent_gateway.__file__); print(agent_gateway_example.__file__); print(p.__file__)"
    where = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).is_relative_to(venv), where.stdout

    done = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=example_source,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    # Every test of the example ran there, on the agw_* fixtures of the installed pytest plugin.
    passed = {line.split("::")[-1] for line in done.stdout.splitlines() if line.startswith("PASSED ")}
    assert {
        "test_a_run_streams_the_message_upper_cased",
        "test_cancel_stops_the_reply_at_once",
        "test_the_descriptor",
        "test_the_distribution_declares_its_entry_point",
    } <= passed, report
    assert "failed" not in done.stdout.splitlines()[-1], report
