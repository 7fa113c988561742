"""agent_gateway.testing as a plugin author meets it: the pytest plugin's fixtures (loaded here
through the installed ``pytest11`` entry point, as in any project that installs agent-gateway),
the HTTP/SSE client, ``start_gateway``, and the promise that loading the plugin costs nothing.

The example plugin's own tests (contrib/example-runtime-plugin/tests) use the same fixtures in
a fresh virtualenv: see tests/test_example_plugin.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from agent_gateway import RuntimePolicy, Turn, TurnOutcome, hookimpl
from agent_gateway.cli import cli
from agent_gateway.testing import (
    ConfigError,
    FakeOpenAI,
    GatewayClient,
    GatewayHTTPError,
    RunningGateway,
    start_gateway,
)

pytestmark = pytest.mark.agw_config(scripted={"greeting": "module"})


class ScriptedRuntime:
    """Emits ``int(message)`` deltas, or waits for a cancel when the message is ``wait``."""

    agent_id = "scripted"
    display_name = "Scripted"
    provider = "test"

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.policy = RuntimePolicy(context_carrier="transcript_rebuild")
        self.closed = False

    def describe(self) -> dict[str, Any]:
        return {"capabilities": ["chat"], "greeting": self.greeting, "_internal": "left out"}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        if turn.message == "wait":
            await turn.cancel_requested.wait()
            return TurnOutcome("cancelled", "stopped on request")
        for index in range(int(turn.message)):
            await turn.emit("message.delta", {"text": f"{index},"})
        return TurnOutcome("completed")

    async def close(self) -> None:
        self.closed = True


class ScriptedPlugin:
    def __init__(self) -> None:
        self.runtime: ScriptedRuntime | None = None

    @hookimpl
    def config_sections(self, register: Any) -> None:
        register("scripted", {"greeting": "default"}, None, "A test runtime.")

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        self.runtime = ScriptedRuntime(config.section("scripted")["greeting"])
        register(self.runtime)


@pytest.fixture
def agw_plugins() -> list[object]:
    return [ScriptedPlugin()]


def test_loading_the_pytest_plugin_imports_nothing_heavy() -> None:
    probe = (
        "import sys, agent_gateway.testing.pytest_plugin; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'peewee', 'orjson', 'watchfiles') "
        "or m in ('agent_gateway.app', 'agent_gateway.plugin_host')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_the_plugin_is_registered_through_its_entry_point(request: pytest.FixtureRequest) -> None:
    plugin = request.config.pluginmanager.get_plugin("agent_gateway")
    assert plugin is not None and plugin.__name__ == "agent_gateway.testing.pytest_plugin"


@pytest.mark.agw_config(scripted={"greeting": "test"})
def test_markers_layer_over_the_module_and_the_fixture(agw_gateway: RunningGateway) -> None:
    assert agw_gateway.runtime("scripted").greeting == "test"
    assert agw_gateway.config.section("gateway")["data_dir"] == str(agw_gateway.data_dir)
    assert (agw_gateway.data_dir / "gateway.db").is_file()  # SQLite under the test's tmp_path


def test_the_module_marker_applies_without_a_test_marker(agw_client: GatewayClient) -> None:
    descriptor = agw_client.agent("scripted")
    # Extra describe() keys reach the descriptor as they are; keys starting with "_" do not.
    assert descriptor["greeting"] == "module" and "_internal" not in descriptor


def test_a_run_streams_to_its_terminal_event_and_pages_agree(agw_client: GatewayClient) -> None:
    result = agw_client.run("250", agent_id="scripted")
    assert result.status == "completed" and result.kinds[0] == "run.created"
    assert result.text == "".join(f"{i}," for i in range(250))
    assert [e.seq for e in result.events] == list(range(1, len(result.events) + 1))

    stored = agw_client.events(result.host_run_id, limit=7)  # many pages, followed to the end
    assert [int(e["seq"]) for e in stored] == [e.seq for e in result.events]
    page = agw_client.events_page(result.host_run_id, after_seq=3, limit=2)
    assert [int(e["seq"]) for e in page["events"]] == [4, 5] and page["complete"] is False

    resumed = agw_client.stream_to_end(result.host_run_id, after_seq=len(result.events) - 2)
    assert [e.event for e in resumed] == result.kinds[-2:]


def test_a_stream_without_a_terminal_event_times_out_naming_what_came(agw_client: GatewayClient) -> None:
    receipt = agw_client.create_run("wait", agent_id="scripted")
    with pytest.raises(TimeoutError, match=r"no terminal event within 0\.5 s; got \['run.created'"):
        agw_client.stream_to_end(receipt["hostRunId"], timeout=0.5)
    agw_client.cancel(receipt["hostRunId"])
    events = agw_client.stream_to_end(receipt["hostRunId"])
    assert events[-1].event == "run.cancelled"
    assert events[-1].payload.get("reason") == "stopped on request"


async def test_the_fixtures_serve_async_tests_too(agw_gateway: RunningGateway, agw_client: GatewayClient) -> None:
    """The gateway has its own loop: an async test's client and the blocking client both work."""
    receipt = agw_client.create_run("3", agent_id="scripted")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{agw_gateway.url}/v1/runs/{receipt['hostRunId']}/stream") as response:
            body = await asyncio.wait_for(response.text(), 20)
    assert body.count("event: message.delta") == 3 and "event: run.completed" in body
    assert agw_client.stream_to_end(receipt["hostRunId"])[-1].event == "run.completed"


def test_refusals_are_errors_with_the_gateways_code(agw_client: GatewayClient) -> None:
    with pytest.raises(GatewayHTTPError) as unknown:
        agw_client.create_run("1", agent_id="no-such-agent")
    assert unknown.value.status == 400 and unknown.value.code
    with pytest.raises(GatewayHTTPError) as missing:
        agw_client.get_run("run_missing")
    assert (missing.value.status, missing.value.code) == (404, "run_not_found")
    assert "404 run_not_found" in str(missing.value)


@pytest.fixture
def agw_config(agw_fake_upstream: FakeOpenAI) -> dict[str, dict[str, Any]]:
    # The built-in OpenAI-compatible runtime, pointed at the scripted fake upstream.
    return {"chat_only": {"base_url": agw_fake_upstream.base_url, "model": "m"}}


def test_the_fake_upstream_fixture_scripts_an_upstream(
    agw_client: GatewayClient, agw_fake_upstream: FakeOpenAI
) -> None:
    agw_fake_upstream.add("scripted reply")
    assert agw_client.run("hi", agent_id="chat-only").text == "scripted reply"
    assert agw_client.run("again", agent_id="chat-only").text == "echo: again"
    assert agw_fake_upstream.requests[0]["messages"][-1]["content"] == "hi"


def test_start_gateway_closes_runtimes_and_stops_its_thread(tmp_path: Path) -> None:
    plugin = ScriptedPlugin()
    with start_gateway([plugin], {"scripted": {"greeting": "direct"}}, data_dir=tmp_path / "gw") as running:
        assert running.client().run("2", agent_id="scripted").text == "0,1,"
        assert running.url == f"http://127.0.0.1:{running.port}"
    assert plugin.runtime is not None and plugin.runtime.closed
    assert not any(t.name == "agw-gateway" and t.is_alive() for t in threading.enumerate())


def test_a_plugin_that_fails_to_load_fails_the_start(tmp_path: Path) -> None:
    class Broken:
        @hookimpl
        def register_runtimes(self, register: Any, config: Any) -> None:
            raise RuntimeError("broken on purpose")

    with pytest.raises(RuntimeError, match="broken on purpose"):
        with start_gateway([Broken()], data_dir=tmp_path / "gw"):
            pytest.fail("the gateway started")
    assert not any(t.name == "agw-gateway" and t.is_alive() for t in threading.enumerate())


class ValidatedPlugin:
    """A plugin with its own validator, as a plugin author tests it."""

    @hookimpl
    def config_sections(self, register: Any) -> None:
        def validate(section: dict[str, Any]) -> list[tuple[str, str]]:
            return [] if section["level"] in ("low", "high") else [("level", "must be low or high")]

        register("validated", {"level": "low", "retries": 1}, validate, "A validated section.")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"scripted": {"greting": "typo"}}, ["agw_config: scripted.greting: unknown key"]),
        ({"scriptd": {"greeting": "x"}}, ["agw_config: scriptd: unknown section (known: "]),
        ({"validated": {"level": "medium"}}, ["agw_config: validated.level: must be low or high"]),
        (
            {"validated": {"level": "medium", "retries": "two"}, "gateway": {"port": 70000}},
            [
                "agw_config: gateway.port: must be 0..65535, got 70000",
                "agw_config: validated.retries: expected int, got str",
                "agw_config: validated.level: must be low or high",
            ],
        ),
    ],
    ids=["key-typo", "section-typo", "plugin-validator", "every-problem"],
)
def test_start_gateway_validates_the_configuration_like_config_check(
    tmp_path: Path, overrides: dict[str, Any], expected: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        with start_gateway([ScriptedPlugin(), ValidatedPlugin()], overrides, data_dir=tmp_path / "gw"):
            pytest.fail("the gateway started with an invalid configuration")
    assert caught.value.problems[0].startswith("invalid configuration")
    problems = caught.value.problems[1:]
    assert len(problems) == len(expected), problems
    for problem in expected:
        assert any(line.startswith(problem) for line in problems), (problem, problems)
    assert "agent-gateway config check" in str(caught.value)
    assert not any(t.name == "agw-gateway" and t.is_alive() for t in threading.enumerate())


def test_the_problems_are_those_config_check_reports(tmp_path: Path) -> None:
    """The same overrides as a TOML file: `agent-gateway config check` names the same problems."""
    overrides = {"gateway": {"port": 70000, "heartbeat_seconds": "often"}, "storage": {"retain_days": -1}}
    with pytest.raises(ConfigError) as caught:
        with start_gateway([], overrides, data_dir=tmp_path / "gw"):
            pytest.fail("the gateway started with an invalid configuration")
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[gateway]\nport = 70000\nheartbeat_seconds = "often"\ndata_dir = "{tmp_path / "gw"}"\n'
        "[storage]\nretain_days = -1\n"
    )
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)], env={})
    assert result.exit_code == 1
    reported = sorted(line.replace(str(path), "agw_config") for line in result.output.splitlines())
    assert sorted(caught.value.problems[1:]) == reported


def test_a_valid_configuration_serves(tmp_path: Path) -> None:
    overrides = {"scripted": {"greeting": "checked"}, "validated": {"level": "high"}}
    with start_gateway([ScriptedPlugin(), ValidatedPlugin()], overrides, data_dir=tmp_path / "gw") as running:
        assert running.runtime("scripted").greeting == "checked"
        assert running.config.section("validated") == {"level": "high", "retries": 1}
