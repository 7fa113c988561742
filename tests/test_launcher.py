"""What the launcher does when a user's setup is off, driven through the real console script:
built-in plugins always load (``AGENT_GATEWAY_LOAD_PLUGINS`` filters third-party plugins only),
and every start-up failure a user can cause (a broken plugin, a port in use, a PostgreSQL URL
without the driver, a storage URL no plugin handles) is one line on stderr and a non-zero exit,
never a traceback.

Third-party plugins here are tiny distributions written into a directory put on ``PYTHONPATH``
(a ``*.dist-info`` with an ``entry_points.txt`` is all ``importlib.metadata`` needs).
"""

from __future__ import annotations

import json
import socket
import sys
from importlib import metadata
from pathlib import Path

import pytest

from agent_gateway.plugin_host import LOAD_ENV, PluginError, PluginHost
from tests._cli import BUILT_INS, clean_env, run_cli, serve

ECHO_PLUGIN = """
from agent_gateway import hookimpl

@hookimpl
def config_sections(register):
    register("{name}", {{"enabled": True}}, None, "a test plugin")
"""


def write_distribution(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """An installed-looking distribution: its dist-info (name, version, entry points) and modules."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[agent_gateway]\n{lines}")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


def with_site(tmp_path: Path, site: Path, **extra: str) -> dict[str, str]:
    return clean_env(tmp_path, PYTHONPATH=str(site), **extra)


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc != 0
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err


@pytest.fixture
def third_party_site(tmp_path: Path) -> Path:
    """Two third-party plugins, `echo` and `other`, from two distributions."""
    site = tmp_path / "site"
    write_distribution(
        site, "ag_echo_plugin", {"echo": "ag_echo_mod"}, {"ag_echo_mod": ECHO_PLUGIN.format(name="echo")}
    )
    write_distribution(
        site, "ag_other_plugin", {"other": "ag_other_mod"}, {"ag_other_mod": ECHO_PLUGIN.format(name="other")}
    )
    return site


# -- built-ins always load ----------------------------------------------------------------------------


async def test_load_plugins_env_filters_third_party_plugins_and_keeps_builtins(
    third_party_site: Path, tmp_path: Path
) -> None:
    rc, out, err = await run_cli("plugins", "--json", env=with_site(tmp_path, third_party_site), cwd=tmp_path)
    assert rc == 0, err
    assert {info["name"] for info in json.loads(out)} == BUILT_INS | {"echo", "other"}

    env = with_site(tmp_path, third_party_site, AGENT_GATEWAY_LOAD_PLUGINS="echo")
    rc, out, err = await run_cli("plugins", "--json", env=env, cwd=tmp_path)
    assert rc == 0, err
    infos = {info["name"]: info for info in json.loads(out)}
    assert set(infos) == BUILT_INS | {"echo"}
    assert infos["echo"]["distribution"] == "ag_echo_plugin"

    # And the gateway serves with only `echo` of the third-party plugins: its section is known,
    # `other`'s is not.
    env = with_site(tmp_path, third_party_site, AGENT_GATEWAY_LOAD_PLUGINS="echo")
    config = tmp_path / "gw.toml"
    config.write_text("[echo]\nenabled = false\n")
    rc, out, err = await run_cli("config", "check", "--config", str(config), env=env, cwd=tmp_path)
    assert (rc, out) == (0, f"{config}: ok\n"), err
    config.write_text("[other]\nenabled = false\n")
    rc, out, _ = await run_cli("config", "check", "--config", str(config), env=env, cwd=tmp_path)
    assert rc == 1 and f"{config}: other: unknown section" in out
    async with serve("--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path) as gw:
        assert gw.port > 0
        assert await gw.terminate() == 0


def test_load_plugins_env_in_process(third_party_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(third_party_site))
    assert {"echo", "other"} <= {ep.name for ep in metadata.entry_points(group="agent_gateway")}
    names = lambda host: {info.name for info in host.plugins()}  # noqa: E731
    assert names(PluginHost.load(env={LOAD_ENV: "echo"})) == BUILT_INS | {"echo"}
    assert names(PluginHost.load(env={LOAD_ENV: ""})) == BUILT_INS
    assert names(PluginHost.load(env={})) == BUILT_INS | {"echo", "other"}
    assert names(PluginHost.load(env={LOAD_ENV: "other"}, builtins={"core"})) == {"core", "other"}


# -- launcher errors: one line, non-zero exit -----------------------------------------------------------


async def test_a_plugin_that_fails_to_import_is_named_with_its_distribution(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_distribution(
        site, "ag_broken_plugin", {"broken": "ag_broken_mod"}, {"ag_broken_mod": "import no_such_module_here\n"}
    )
    for command in (["serve", "--port", "0"], ["config", "check"], ["plugins"]):
        rc, out, err = await run_cli(*command, env=with_site(tmp_path, site), cwd=tmp_path)
        assert_one_line_error(rc, err, "plugin 'broken'", "ag_broken_plugin 1.0", "no_such_module_here")
        assert "listening" not in out
    # Leaving it out by name lets the gateway start.
    rc, out, err = await run_cli("plugins", env=with_site(tmp_path, site, AGENT_GATEWAY_LOAD_PLUGINS=""), cwd=tmp_path)
    assert rc == 0 and "broken" not in out, err
    with pytest.raises(PluginError, match=r"plugin 'broken' \(ag_broken_mod, from ag_broken_plugin 1.0\)"):
        sys.path.insert(0, str(site))
        try:
            PluginHost.load(env={})
        finally:
            sys.path.remove(str(site))


async def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, err = await run_cli(
            "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), env=clean_env(tmp_path), cwd=tmp_path
        )
    assert_one_line_error(rc, err, f"cannot listen on 127.0.0.1:{port}", "address already in use")
    assert "listening" not in out


async def test_a_postgresql_url_without_the_driver_names_the_extra(tmp_path: Path) -> None:
    # The driver is installed here: a package of the same name first on the path stands in for
    # an environment without it.
    shadow = tmp_path / "no-driver"
    (shadow / "psycopg2").mkdir(parents=True)
    (shadow / "psycopg2" / "__init__.py").write_text("raise ImportError('No module named psycopg2')\n")
    env = clean_env(
        tmp_path, PYTHONPATH=str(shadow), AGENT_GATEWAY__STORAGE__URL="postgresql://gw:secret@127.0.0.1:5432/test"
    )
    rc, out, err = await run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "d"), env=env, cwd=tmp_path)
    assert_one_line_error(rc, err, "PostgreSQL driver", "pip install 'agent-gateway[postgresql]'")
    assert "secret" not in err and "listening" not in out
    rc, out, err = await run_cli("config", "check", env=env, cwd=tmp_path)
    assert rc == 1 and "storage.url" in out and "pip install 'agent-gateway[postgresql]'" in out, out + err
    # The control: with the real driver the same URL is accepted.
    rc, out, err = await run_cli("config", "check", env={**env, "PYTHONPATH": ""}, cwd=tmp_path)
    assert (rc, out) == (0, "<defaults>: ok\n"), out + err


async def test_a_storage_url_no_plugin_handles_is_one_line(tmp_path: Path) -> None:
    env = clean_env(tmp_path, AGENT_GATEWAY__STORAGE__URL="mongodb://x")
    rc, out, err = await run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "d"), env=env, cwd=tmp_path)
    assert_one_line_error(rc, err, "no storage plugin handles 'mongodb://x'")
    rc, out, err = await run_cli("config", "check", env=env, cwd=tmp_path)
    assert rc == 1 and "<defaults>: storage.url: no storage plugin handles 'mongodb://x'" in out, out + err


async def test_storage_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database folder should be")
    env = clean_env(tmp_path, AGENT_GATEWAY__STORAGE__URL=f"sqlite:///{blocker}/gateway.db")
    rc, _, err = await run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "d"), env=env, cwd=tmp_path)
    assert_one_line_error(rc, err, f"storage sqlite:///{blocker}/gateway.db could not be opened")
