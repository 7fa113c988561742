"""ACP agents declared by configuration alone (`[acp_agents.<agent-id>]`), and explicit agent
environments.

The ACP end-to-end tests run the real launcher (`python -m agent_gateway.cli serve --config FILE`) as
a subprocess, with no plugin of their own: the fake ACP agents (`contrib/fake_acp_agents`) are
declared in the TOML file only. They drive the HTTP API like a client (two turns, the permission
loop, a gateway restart with `session/load`, `GET /v1/agents`) and read the agent processes'
`/proc/<pid>/environ` to see what environment they got (the helper and Pi: test_agent_environment.py).
`config check` is run as users run it.

Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from agent_gateway.acp.agents import TABLE_DEFAULTS
from agent_gateway.acp.runtime import AcpRuntime
from agent_gateway.app import create_app
from agent_gateway.cli import cli
from agent_gateway.config import Config, section_specs_from_hook
from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.plugin_host import PluginError, PluginHost
from tests._harness import FAKE_ACP_AGENT, WAIT, GatewayProcess, children_of, sse_events, start_gateway_process

ROOT = Path(__file__).resolve().parent.parent
SECRET_NAME = "AGENT_GATEWAY_TEST_SECRET"
SECRET = "s3cret-" + uuid.uuid4().hex
DISPLAY_NAME = "Configured Echo"


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def agent_command(behaviour: str) -> list[str]:
    return [sys.executable, FAKE_ACP_AGENT, "--behaviour", behaviour]


def write_config(tmp_path: Path) -> Path:
    """Three agents, nothing but TOML: a replaying echo agent, a permission-asking one, and one
    that inherits the gateway's environment."""
    state = tmp_path / "agent-state"
    text = f"""
[reasonix]
enabled = false

[hermes]
enabled = false

[pi_lab]
enabled = false

[acp_agents.toml-echo]
command = {toml_list(agent_command("replay"))}
display_name = "{DISPLAY_NAME}"
provider = "fake-vendor"
env = {{ FAKE_ACP_STATE_DIR = "{state}", SECTION_ONLY = "from-the-section" }}
sandbox_writable = ["{state}"]
initialize_timeout = 30.0
session_timeout = 30.0
prompt_timeout = 60.0
cancel_grace = 5.0

[acp_agents.toml-permission]
command = {toml_list(agent_command("permission"))}

[acp_agents.toml-inherit]
command = {toml_list(agent_command("basic"))}
inherit_env = true
env = {{ SECTION_ONLY = "inherited-too" }}
"""
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT * 2)) as session:
        yield session


async def start(tmp_path: Path, config: Path, index: int) -> GatewayProcess:
    return await start_gateway_process(
        tmp_path / "data",
        tmp_path / f"gateway-{index}.log",
        env={SECRET_NAME: SECRET},
        args=["--config", str(config)],
    )


class Client:
    """The HTTP API of one running gateway process."""

    def __init__(self, http: aiohttp.ClientSession, gateway: GatewayProcess) -> None:
        self.http = http
        self.gateway = gateway
        self.url = gateway.url

    async def post_run(self, agent_id: str, session_id: str, message: str) -> str:
        body = {
            "requestId": "req-" + uuid.uuid4().hex[:10],
            "agentId": agent_id,
            "sessionId": session_id,
            "workspaceId": "local:test",
            "message": message,
        }
        async with self.http.post(f"{self.url}/v1/runs", json=body) as response:
            assert response.status == 201, f"{await response.text()}\n{self.gateway.log()}"
            return str((await response.json())["hostRunId"])

    async def receipt(self, run_id: str) -> dict[str, Any]:
        async with self.http.get(f"{self.url}/v1/runs/{run_id}") as response:
            assert response.status == 200, await response.text()
            return dict(await response.json())

    async def stream(self, run_id: str, until: str | None = None) -> list[dict[str, Any]]:
        """The run's events (SSE data) up to its terminal event, or up to the first `until` event."""
        events: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT), self.http.get(f"{self.url}/v1/runs/{run_id}/stream") as response:
            assert response.status == 200, await response.text()
            async for item in sse_events(response):
                events.append(item["data"])
                if item["data"]["kind"] == until:
                    return events
        assert events and events[-1]["kind"] in TERMINAL_KINDS, [e["kind"] for e in events]
        return events

    async def turn(self, agent_id: str, session_id: str, message: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        run_id = await self.post_run(agent_id, session_id, message)
        events = await self.stream(run_id)
        return await self.receipt(run_id), events

    async def agents(self) -> dict[str, dict[str, Any]]:
        async with self.http.get(f"{self.url}/v1/agents") as response:
            assert response.status == 200, await response.text()
            body = await response.json()
        return {agent["agentId"]: agent for agent in body["agents"]}


def reply(events: list[dict[str, Any]]) -> str:
    [done] = [e for e in events if e["kind"] == "message.completed"]
    return str(done["payload"]["text"])


def agent_process(gateway: GatewayProcess, behaviour: str) -> int:
    """The pid of the gateway's (one) live fake agent running `behaviour`."""
    found = []
    for pid in children_of(gateway.proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if FAKE_ACP_AGENT.encode() in argv and behaviour.encode() in argv:
            found.append(pid)
    assert len(found) == 1, f"expected one live {behaviour} agent, found {found}"
    return found[0]


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


# -- end to end: a real `serve` process ----------------------------------------------------------------


async def test_an_acp_agent_declared_only_in_toml_runs_turns_permissions_and_a_restart(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    config = write_config(tmp_path)
    gateway = await start(tmp_path, config, 1)
    try:
        client = Client(http, gateway)

        # The configured agents are listed under their own ids and names.
        agents = await client.agents()
        echo = agents["toml-echo"]
        assert (echo["displayName"], echo["provider"]) == (DISPLAY_NAME, "fake-vendor")
        assert echo["availability"]["available"] is True
        assert agents["toml-permission"]["displayName"] == "toml-permission"  # default: the agent id
        assert not {"reasonix", "hermes", "pi-lab"} & set(agents)

        # Two turns of one gateway session share one live agent session.
        first, events = await client.turn("toml-echo", "s1", "hello")
        assert (first["status"], first["sessionMode"]) == ("completed", "new_session"), gateway.log()
        assert reply(events) == "echo: hello"
        assert {e["source"] for e in events if e["kind"] == "message.delta"} == {"toml-echo"}

        # The live agent got the base environment and its table's env, not the gateway's secret.
        environ = environ_of(agent_process(gateway, "replay"))
        assert SECRET_NAME not in environ and SECRET not in "".join(environ.values())
        assert environ["SECTION_ONLY"] == "from-the-section"
        assert environ["PATH"] == os.environ["PATH"]

        second, events = await client.turn("toml-echo", "s1", "history?")
        assert (second["status"], second["sessionMode"]) == ("completed", "native_live")
        assert second["providerRunId"] == first["providerRunId"]
        assert reply(events) == "hello"

        # The permission loop: requested, answered over HTTP, resolved, and the turn goes on.
        run_id = await client.post_run("toml-permission", "s2", "write it")
        asked = (await client.stream(run_id, until="permission.requested"))[-1]["payload"]
        assert (await client.receipt(run_id))["status"] == "awaiting_permission"
        answer_url = f"{client.url}/v1/runs/{run_id}/permissions/{asked['requestId']}"
        async with http.post(answer_url, json={"optionId": "allow_once"}) as response:
            assert response.status == 200, await response.text()
        events = await client.stream(run_id)
        resolved = [e["payload"] for e in events if e["kind"] == "permission.resolved"]
        assert resolved == [
            {"requestId": asked["requestId"], "outcome": "selected", "optionId": "allow_once", "by": "client"}
        ]
        assert reply(events) == "permission: allow_once"
        assert (await client.receipt(run_id))["status"] == "completed"

        # inherit_env = true: that agent gets the gateway's whole environment (its env still wins).
        inherited, _ = await client.turn("toml-inherit", "s3", "hi")
        assert inherited["status"] == "completed"
        environ = environ_of(agent_process(gateway, "basic"))
        assert environ[SECRET_NAME] == SECRET and environ["SECTION_ONLY"] == "inherited-too"
    finally:
        await gateway.stop()

    # A new gateway process on the same data: the agent session is loaded (`session/load`).
    gateway = await start(tmp_path, config, 2)
    try:
        client = Client(http, gateway)
        third, events = await client.turn("toml-echo", "s1", "history?")
        assert (third["status"], third["sessionMode"]) == ("completed", "loaded"), gateway.log()
        assert third["providerRunId"] == first["providerRunId"]
        assert reply(events) == "hello|history?"
        assert any(e["kind"] == "session.replayed" for e in events)
    finally:
        await gateway.stop()


# -- config check ------------------------------------------------------------------------------------


def check(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)])
    return result.exit_code, [line.replace(f"{path}: ", "FILE: ") for line in result.output.splitlines()]


def test_config_check_reports_every_problem_of_a_bad_table(tmp_path: Path) -> None:
    code, lines = check(
        tmp_path,
        """
[acp_agents.good]
command = ["agent", "--acp"]

[acp_agents.bad]
command = []
display_nam = "typo"
env = { KEY = ["not", "a", "string"] }
max_processes = "four"
prompt_timeout = -1.0
cancel_grace = 0
process_dir = "relative/dir"
mcp_servers = ["nope"]

[acp_agents."Bad.Id"]
command = ["agent"]

[acp_agents.empty]
""",
    )
    assert code == 1
    assert sorted(lines) == sorted(
        [
            "FILE: acp_agents.bad.display_nam: unknown key",
            "FILE: acp_agents.bad.max_processes: expected int, got str",
            "FILE: acp_agents.bad.command: must be a non-empty list of strings",
            "FILE: acp_agents.bad.cancel_grace: must be positive",
            "FILE: acp_agents.bad.prompt_timeout: must be positive, or 0 for no limit",
            "FILE: acp_agents.bad.env.KEY: must be a string (or a number)",
            "FILE: acp_agents.bad.mcp_servers[0]: must be a table with a `name` (ACP McpServer)",
            'FILE: acp_agents.bad.process_dir: must be "workspace", "gateway" or an absolute directory',
            "FILE: acp_agents.Bad.Id: 'Bad.Id' is not a valid name (must match ^[a-z0-9][a-z0-9_-]{0,63}$)",
            "FILE: acp_agents.empty.command: must be a non-empty list of strings",
        ]
    ), lines


def test_config_check_accepts_a_good_table_and_the_example(tmp_path: Path) -> None:
    code, lines = check(tmp_path, '[acp_agents.my-agent]\ncommand = ["my-agent", "acp"]\nprompt_timeout = 0.0\n')
    assert (code, lines) == (0, ["FILE: ok"])
    example = ROOT / "config" / "examples" / "acp-agent.toml"
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(example)])
    assert (result.exit_code, result.output) == (0, f"{example}: ok\n")


def test_a_table_value_in_place_of_a_table_and_env_overrides_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[acp_agents]\nlonely = "value"\n', encoding="utf-8")
    env = {"AGENT_GATEWAY__ACP_AGENTS__ENVAGENT__COMMAND": '["agent"]', "AGENT_GATEWAY__ACP_AGENTS__X": "1"}
    host = PluginHost.load(env={})
    config = Config.load(path, section_specs_from_hook(host.config_sections()), env=env)
    assert sorted(p.replace(f"{path}: ", "FILE: ") for p in config.problems()) == [
        "FILE: acp_agents.lonely: must be a table ([acp_agents.lonely])",
        "environment: AGENT_GATEWAY__ACP_AGENTS__X: name a key too (AGENT_GATEWAY__ACP_AGENTS__X__<KEY>)",
    ]
    # the override made a table of its own
    assert config.section("acp_agents")["envagent"]["command"] == ["agent"]


def test_an_agent_id_a_plugin_already_registers_stops_the_gateway_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[gateway]\ndata_dir = "{tmp_path / "data"}"\n[acp_agents.chat-only]\ncommand = ["agent"]\n')
    with pytest.raises(PluginError, match=r"'chat-only' registered twice .*\[acp_agents\.chat-only\]"):
        create_app(Config.load(path, env={}), PluginHost.load(env={}))


def test_default_toml_shows_every_table_key_in_its_commented_example() -> None:
    text = (ROOT / "config" / "default.toml").read_text(encoding="utf-8")
    example = text.split("[acp_agents]", 1)[1].split("\n[", 1)[0]
    lines = [line.removeprefix("# ").split("  #")[0] for line in example.splitlines() if " = " in line]
    shown = tomllib.loads("\n".join(line for line in lines if not line.startswith("command")))
    assert {**shown, "command": []} == TABLE_DEFAULTS


def test_a_runtime_carries_its_own_session_strategy_and_plugins_need_no_hook(tmp_path: Path) -> None:
    """The built-in ACP and Pi plugins pick their strategy through the runtime, not a hook."""
    path = tmp_path / "gateway.toml"
    path.write_text(f'[gateway]\ndata_dir = "{tmp_path / "data"}"\n[acp_agents.own]\ncommand = ["agent"]\n')
    host = PluginHost.load(env={})
    config = Config.load(path, section_specs_from_hook(host.config_sections()), env={})
    runtimes = {runtime.agent_id: runtime for runtime in host.runtimes(config)}
    for agent_id in ("own", "reasonix", "hermes", "pi-lab", "chat-only"):
        runtime = runtimes[agent_id]
        assert host.session_strategy(runtime, config) is runtime.session_strategy, agent_id
    assert isinstance(runtimes["own"], AcpRuntime)
    hooked = {info.name for info in host.plugins() if "session_strategy" in info.hooks}
    assert hooked == {"core"}


def test_reasonix_and_hermes_sections_take_the_timeouts_too(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'[gateway]\ndata_dir = "{tmp_path / "data"}"\n'
        "[reasonix]\ninitialize_timeout = 5.0\nsession_timeout = 6.0\nprompt_timeout = 7.0\ncancel_grace = 8.0\n"
        "[hermes]\nprompt_timeout = 0.0\ninherit_env = true\n",
        encoding="utf-8",
    )
    host = PluginHost.load(env={})
    config = Config.load(path, section_specs_from_hook(host.config_sections()), env={})
    assert config.problems() == []
    runtimes = {runtime.agent_id: runtime for runtime in host.runtimes(config)}
    reasonix, hermes = runtimes["reasonix"], runtimes["hermes"]
    assert isinstance(reasonix, AcpRuntime) and isinstance(hermes, AcpRuntime)
    spec = reasonix.spec
    assert (spec.initialize_timeout, spec.session_timeout, spec.prompt_timeout, spec.cancel_grace) == (5, 6, 7, 8)
    assert (hermes.spec.prompt_timeout, hermes.spec.inherit_env, reasonix.spec.inherit_env) == (None, True, False)
