"""One test per hook of the `agent_gateway` contract (hookspecs/), through the PluginHost facade,
asserting what a user of the gateway would see; plus the facade's own rules: unknown hooks are
rejected at load, built-ins always load (AGENT_GATEWAY_LOAD_PLUGINS filters third-party ones), AGENT_GATEWAY_TRACE_HOOKS
traces calls, and the built-in defaults are trylast so any plugin can override them.

The core does not call the tool hooks (`register_tools`, `tool_call_veto`, `tool_call_completed`)
nor `negotiate_runtime_policy` yet; those are tested through the facade methods the core will use.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

import agent_gateway.builtin
import agent_gateway.cli
import agent_gateway.plugins.journal_peewee
from agent_gateway import GatewayContext, ModelCallTrace, PluginRoutes, RunTrace
from agent_gateway.app import create_app
from agent_gateway.cli import cli
from agent_gateway.config import Config, section_specs_from_hook
from agent_gateway.hookspecs import PROJECT_NAME, SPEC_MODULES, hookimpl
from agent_gateway.plugin_host import LOAD_ENV, TRACE_ENV, PluginError, PluginHost
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.runtime import RuntimePolicy, SessionPlan, Turn, TurnOutcome
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import events_page, gateway_of, read_stream, run_body, run_to_end, sse_events

ROOT = Path(__file__).resolve().parent.parent
BUILTIN_NAMES = {"core", "journal_peewee", "chat_only"}


def all_hook_names() -> set[str]:
    return {
        name
        for module in SPEC_MODULES
        for name, value in vars(module).items()
        if callable(value) and hasattr(value, f"{PROJECT_NAME}_spec")
    }


class EchoRuntime:
    """A tiny runtime: replies `echo:<message>` in two deltas."""

    display_name = "Echo (test)"
    provider = "test"

    def __init__(self, agent_id: str = "hook-echo", label: str = "") -> None:
        self.agent_id = agent_id
        self.label = label
        self.policy = RuntimePolicy(context_carrier="transcript_rebuild")
        self.turns: list[Turn] = []
        self.closed = False

    def describe(self) -> dict[str, Any]:
        return {"capabilities": ["chat"], "label": self.label}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        self.turns.append(turn)
        await turn.emit("message.delta", {"text": "echo:"})
        await turn.emit("message.delta", {"text": turn.message})
        await turn.emit("message.completed", {"text": f"echo:{turn.message}"})
        return TurnOutcome("completed")

    async def close(self) -> None:
        self.closed = True


class RuntimePlugin:
    def __init__(self, runtime: EchoRuntime | None = None) -> None:
        self.runtime = runtime or EchoRuntime()

    @hookimpl
    def register_runtimes(self, register: Callable[[Any], None], config: Any) -> None:
        register(self.runtime)


def config_with(tmp_path: Path, **sections: dict[str, Any]) -> Config:
    return Config.load(None, env={}, overrides={"gateway": {"data_dir": str(tmp_path / "data")}, **sections})


# -- the hooks, one test each ------------------------------------------------------------------------


async def test_register_runtimes_agent_is_listed_and_runs_a_turn(make_gateway: Any) -> None:
    plugin = RuntimePlugin()
    client = await make_gateway(extra_plugins=(plugin,))
    response = await client.get("/v1/agents")
    agents = {a["agentId"]: a for a in (await response.json())["agents"]}
    assert agents["hook-echo"]["displayName"] == "Echo (test)"
    assert agents["hook-echo"]["policy"]["contextCarrier"] == "transcript_rebuild"
    assert "chat-only" in agents  # the built-in runtimes are still there

    receipt, events = await run_to_end(client, run_body("hi", agentId="hook-echo"))
    assert receipt["provider"] == "test"
    text = "".join(e["data"]["payload"]["text"] for e in events if e["event"] == "message.delta")
    assert text == "echo:hi"
    assert events[-1]["event"] == "run.completed"


async def test_register_runtimes_duplicate_agent_id_is_a_startup_error(tmp_path: Path) -> None:
    host = PluginHost.load(env={}, extra=(RuntimePlugin(EchoRuntime("chat-only")),))
    with pytest.raises(PluginError, match="'chat-only' registered twice"):
        create_app(config_with(tmp_path), host)


def test_negotiate_runtime_policy_every_implementation_adjusts_the_policy() -> None:
    """Not called by the core yet (no ACP runtime is wired); tested through the facade."""
    calls: list[str] = []

    class FromInitialize:
        @hookimpl
        def negotiate_runtime_policy(self, agent_id: str, policy: RuntimePolicy, initialize_result: dict) -> None:
            calls.append("init")
            caps = initialize_result.get("agentCapabilities", {})
            policy.load_session = bool(caps.get("loadSession"))
            policy.mcp_http = bool(caps.get("mcpCapabilities", {}).get("http"))

    class SiteRule:
        @hookimpl
        def negotiate_runtime_policy(self, agent_id: str, policy: RuntimePolicy, initialize_result: dict) -> None:
            calls.append("site")
            if agent_id == "hermes":
                policy.extra["promptQueue"] = "agent"

    host = PluginHost.load(env={}, builtins=False, extra=(FromInitialize(), SiteRule()))
    policy = RuntimePolicy()
    answer = {"agentCapabilities": {"loadSession": True, "mcpCapabilities": {"http": True}}}
    assert host.negotiate_runtime_policy("hermes", policy, answer) is None
    assert sorted(calls) == ["init", "site"]  # not firstresult: all are called
    assert policy.load_session and policy.mcp_http
    assert policy.to_wire()["promptQueue"] == "agent"


async def test_sandbox_agent_first_plugin_confines_and_the_builtin_is_trylast(tmp_path: Path) -> None:
    """A plugin's `sandbox_agent` wins over the built-in bubblewrap one (trylast); the Sandbox
    service applies `[sandbox] mode` to what the hook answers."""
    from agent_gateway import AgentLaunch, SandboxedCommand, SandboxError, SandboxUnavailable
    from agent_gateway.sandbox import Sandbox

    class Wrapping:
        @hookimpl
        def sandbox_agent(self, launch: AgentLaunch) -> SandboxedCommand:
            return SandboxedCommand(["nsjail", "--", *launch.command], launch.env, str(launch.cwd), "nsjail (test)")

    class Unable:
        @hookimpl
        def sandbox_agent(self, launch: AgentLaunch) -> SandboxUnavailable:
            return SandboxUnavailable("no namespaces here (test)")

    home = tmp_path / "home"
    launch = AgentLaunch("a", "alice", "w", ["agent"], {}, home, home, home / "no-workspace")
    host = PluginHost.load(env={}, extra=(Wrapping(),))
    command = await Sandbox({"mode": "required"}, host, data_dir=tmp_path).confine(launch)
    assert command.argv == ["nsjail", "--", "agent"] and command.confinement == "nsjail (test)"

    unable = PluginHost.load(env={}, builtins=False, extra=(Unable(),))
    with pytest.raises(SandboxError, match="no namespaces here"):
        await Sandbox({"mode": "required"}, unable, data_dir=tmp_path).confine(launch)
    command = await Sandbox({"mode": "auto"}, unable, data_dir=tmp_path).confine(launch)
    assert command.argv == ["agent"] and not command.confined
    off = await Sandbox({"mode": "off"}, host, data_dir=tmp_path).confine(launch)
    assert off.argv == ["agent"] and not off.confined


class FixedStrategy:
    def __init__(self, mode: str = "native_live") -> None:
        self.mode = mode
        self.planned: list[str] = []

    async def plan(self, turn: Turn, runtime: Any) -> SessionPlan:
        self.planned.append(turn.run.host_run_id)
        return SessionPlan(self.mode, detail={"strategy": "fixed"})


class StrategyPlugin:
    def __init__(self, strategy: FixedStrategy, agent_id: str = "hook-echo") -> None:
        self.strategy = strategy
        self.agent_id = agent_id

    @hookimpl
    def session_strategy(self, runtime: Any, config: Any) -> Any:
        return self.strategy if runtime.agent_id == self.agent_id else None


async def test_session_strategy_decides_the_runs_session_mode(make_gateway: Any) -> None:
    strategy = FixedStrategy("native_live")
    client = await make_gateway(extra_plugins=(RuntimePlugin(), StrategyPlugin(strategy)))
    receipt, events = await run_to_end(client, run_body("hi", agentId="hook-echo"))
    assert strategy.planned == [receipt["hostRunId"]]
    info = [e["data"]["payload"] for e in events if e["event"] == "session.info.updated"]
    assert info == [{"sessionMode": "native_live", "strategy": "fixed"}]
    final = await (await client.get(f"/v1/runs/{receipt['hostRunId']}")).json()
    assert final["sessionMode"] == "native_live"

    # The built-in default still serves the runtimes the plugin declines (chat-only: new session).
    receipt, _ = await run_to_end(client, run_body("hello"))
    final = await (await client.get(f"/v1/runs/{receipt['hostRunId']}")).json()
    assert final["sessionMode"] == "new_session"


def test_builtin_session_strategy_is_trylast_so_any_plugin_overrides_it() -> None:
    """The plugin is registered *before* the core here: without trylast, pluggy would call the
    core (registered later) first and its default would win."""
    strategy = FixedStrategy()
    host = PluginHost.load(env={}, builtins=False, extra=(StrategyPlugin(strategy), agent_gateway.builtin))
    assert host.session_strategy(EchoRuntime(), None) is strategy
    default = host.session_strategy(EchoRuntime("other"), None)
    assert type(default).__name__ == "TranscriptStrategy"


async def test_session_strategy_of_a_later_plugin_wins_over_the_builtin(make_gateway: Any) -> None:
    """chat-only has its own strategy and the core a trylast default; a third-party plugin wins."""
    strategy = FixedStrategy("loaded")
    client = await make_gateway(extra_plugins=(StrategyPlugin(strategy, agent_id="chat-only"),))
    receipt, _ = await run_to_end(client, run_body("hi"))
    assert strategy.planned == [receipt["hostRunId"]]
    final = await (await client.get(f"/v1/runs/{receipt['hostRunId']}")).json()
    assert final["sessionMode"] == "loaded"


class Tool:
    def __init__(self, name: str) -> None:
        self.name = name
        self.schema = {"type": "object", "properties": {"path": {"type": "string"}}}
        self.capabilities = ("workspace.read",)

    async def handler(self, call: Any) -> dict[str, Any]:
        return {"ok": True}


def test_register_tools_collects_every_plugins_tools() -> None:
    """The tool facade is not wired into the core yet; tested through the facade."""

    class Workspace:
        @hookimpl
        def register_tools(self, register: Callable[[Any], None], config: Any) -> None:
            register(Tool("workspace.read_file"))
            register(Tool("workspace.patch_file"))

    class Knowledge:
        @hookimpl
        def register_tools(self, register: Callable[[Any], None], config: Any) -> None:
            if config["knowledge"]:
                register(Tool("knowledge_rag.query"))

    host = PluginHost.load(env={}, builtins=False, extra=(Workspace(), Knowledge()))
    names = sorted(t.name for t in host.tools({"knowledge": True}))
    assert names == ["knowledge_rag.query", "workspace.patch_file", "workspace.read_file"]
    assert sorted(t.name for t in host.tools({"knowledge": False})) == ["workspace.patch_file", "workspace.read_file"]


def test_tool_call_veto_first_reason_wins() -> None:
    """Not called by the core yet (no tool facade); tested through the facade."""
    asked: list[str] = []

    class Allow:
        @hookimpl
        def tool_call_veto(self, call: Any) -> str | None:
            asked.append("allow")
            return None

    class NoWritesOnFriday:
        @hookimpl
        def tool_call_veto(self, call: Any) -> str | None:
            asked.append("friday")
            return "no writes on Friday" if call["tool"].endswith("patch_file") else None

    host = PluginHost.load(env={}, builtins=False, extra=(Allow(), NoWritesOnFriday()))
    assert host.tool_call_veto({"tool": "workspace.read_file"}) is None
    assert sorted(asked) == ["allow", "friday"]  # nobody vetoed: all were asked
    asked.clear()
    assert host.tool_call_veto({"tool": "workspace.patch_file"}) == "no writes on Friday"
    assert asked == ["friday"]  # firstresult: the first reason stops the call


class RecordingTrace(RunTrace):
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def __init__(self) -> None:
        self.model_calls: list[tuple[str, str, dict[str, Any], str | None]] = []
        self.ended: tuple[str, dict[str, Any]] | None = None

    def model_call(self, operation: str, model: str, provider: str) -> ModelCallTrace:
        trace = self

        class Call(ModelCallTrace):
            def __init__(self) -> None:
                self.headers = {"traceparent": trace.traceparent}

            def end(self, *, usage: Any = None, error: str | None = None, response_model: str | None = None) -> None:
                trace.model_calls.append((operation, model, dict(usage or {}), error))

        return Call()

    def end(self, run: Any, usage: Any) -> None:
        self.ended = (run.status, dict(usage or {}))


class TracePlugin:
    def __init__(self) -> None:
        self.traces: dict[str, RecordingTrace] = {}
        self.asked: list[tuple[str, str | None]] = []

    @hookimpl
    def trace_run(self, run: Any, agent_name: str, headers: Any, config: Any) -> RunTrace:
        self.asked.append((agent_name, headers.get("x-test-trace")))  # case-insensitive
        trace = self.traces[run.host_run_id] = RecordingTrace()
        return trace


async def test_trace_run_follows_a_run_from_its_receipt_to_its_end(make_gateway: Any, fake_llm: FakeOpenAI) -> None:
    plugin = TracePlugin()
    client = await make_gateway(extra_plugins=(plugin,))
    fake_llm.add(Reply(text="traced", usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}))
    receipt, events = await run_to_end(client, run_body("hello"), headers={"X-Test-Trace": "yes"})
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    assert events[-1]["event"] == "run.completed"
    assert plugin.asked == [("Chat only", "yes")]
    assert receipt["traceId"] == RecordingTrace.trace_id
    trace = plugin.traces[receipt["hostRunId"]]
    tokens = {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7}
    assert trace.model_calls == [("chat", "m", tokens, None)]  # chat-only wrapped its one model call
    assert fake_llm.request_headers[-1]["traceparent"] == RecordingTrace.traceparent
    assert trace.ended == ("completed", tokens)
    # A repeated requestId is the same run: not traced again.
    response = await client.post(
        "/v1/runs", json={**run_body("hello"), "requestId": receipt["requestId"], "sessionId": receipt["sessionId"]}
    )
    assert response.status == 200 and len(plugin.asked) == 1


def test_tool_call_completed_every_observer_sees_the_receipt() -> None:
    """Not called by the core yet (no tool facade); tested through the facade."""
    seen: list[tuple[str, str, bool]] = []

    class Audit:
        @hookimpl
        def tool_call_completed(self, call: Any, receipt: dict[str, Any]) -> None:
            seen.append(("audit", call["tool"], receipt["allowed"]))

    class Metrics:
        @hookimpl
        def tool_call_completed(self, call: Any, receipt: dict[str, Any]) -> None:
            seen.append(("metrics", call["tool"], receipt["allowed"]))

    host = PluginHost.load(env={}, builtins=False, extra=(Audit(), Metrics()))
    host.tool_call_completed({"tool": "workspace.patch_file"}, {"allowed": False, "reason": "vetoed"})
    assert sorted(seen) == [("audit", "workspace.patch_file", False), ("metrics", "workspace.patch_file", False)]


class CountingStorage(PeeweeStorage):
    """The peewee journal, counting what it is asked to write."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.appended = 0

    def append_events(self, events: Any) -> None:
        self.appended += len(events)
        super().append_events(events)


class StoragePlugin:
    def __init__(self) -> None:
        self.urls: list[str] = []

    @hookimpl
    def storage_backend(self, url: str, config: Any) -> Any:
        self.urls.append(url)
        return CountingStorage(url) if url.startswith("sqlite:") else None


async def test_storage_backend_plugin_overrides_the_trylast_default(make_gateway: Any) -> None:
    plugin = StoragePlugin()
    client = await make_gateway(extra_plugins=(plugin,))
    storage = gateway_of(client).storage
    assert isinstance(storage, CountingStorage)
    assert plugin.urls == [gateway_of(client).config.storage_url]
    assert plugin.urls[0].startswith("sqlite:///") and plugin.urls[0].endswith("gateway.db")
    receipt, events = await run_to_end(client, run_body("stored by a plugin"))
    await gateway_of(client).runs.wait(receipt["hostRunId"])
    assert len(await events_page(client, receipt["hostRunId"])) == len(events)
    assert storage.appended >= len(events)


def test_builtin_storage_is_trylast_and_unknown_schemes_are_a_clear_error(tmp_path: Path) -> None:
    plugin = StoragePlugin()
    # The plugin registered before the built-in journal still wins: the journal is trylast.
    host = PluginHost.load(env={}, builtins=False, extra=(plugin, agent_gateway.plugins.journal_peewee))
    assert isinstance(host.storage_backend(f"sqlite:///{tmp_path}/x.db", None), CountingStorage)
    # A scheme nobody handles.
    host = PluginHost.load(env={}, extra=())
    config = config_with(tmp_path, storage={"url": "mongodb://db/x"})
    with pytest.raises(PluginError, match="no storage plugin handles 'mongodb://db/x'"):
        create_app(config, host)


class ShoutProjection:
    @hookimpl
    def register_projections(self, register: Callable[[str, Callable[[Any], Any]], None]) -> None:
        def shout(event: Any) -> dict[str, Any] | None:
            if event.kind == "message.delta":
                return {"seq": event.seq, "text": event.payload["text"].upper()}
            if event.is_terminal:
                return {"seq": event.seq, "done": event.kind}
            return None  # hidden from this projection

        register("shout", shout)


async def test_register_projections_selectable_on_events_and_stream(make_gateway: Any, fake_llm: Any) -> None:
    client = await make_gateway(extra_plugins=(ShoutProjection(),))
    receipt, events = await run_to_end(client, run_body("quiet words"))
    run_id = receipt["hostRunId"]

    page = await (await client.get(f"/v1/runs/{run_id}/events", params={"projection": "shout"})).json()
    assert "".join(item.get("text", "") for item in page["events"]) == "ECHO: QUIET WORDS"
    assert page["events"][-1] == {"seq": int(events[-1]["id"]), "done": "run.completed"}
    assert page["complete"] is True

    async with client.get(f"/v1/runs/{run_id}/stream", params={"projection": "shout"}) as response:
        streamed = [e["data"] async for e in sse_events(response)]
    assert streamed == page["events"]

    # The built-in projections are still there, and an unknown one is a 400 naming the known ones.
    assert (await client.get(f"/v1/runs/{run_id}/events", params={"projection": "openai"})).status == 200
    response = await client.get(f"/v1/runs/{run_id}/events", params={"projection": "nope"})
    assert response.status == 400
    assert {"openai", "shout", "ui"} <= set((await response.json())["error"]["known"])


async def test_register_projections_a_plugin_may_replace_a_builtin_projection(make_gateway: Any) -> None:
    class PlainOpenAI:
        @hookimpl
        def register_projections(self, register: Callable[[str, Callable[[Any], Any]], None]) -> None:
            register("openai", lambda event: {"kind": event.kind})

    client = await make_gateway(extra_plugins=(PlainOpenAI(),))
    receipt, events = await run_to_end(client, run_body("x"))
    page = await (await client.get(f"/v1/runs/{receipt['hostRunId']}/events?projection=openai")).json()
    assert [item["kind"] for item in page["events"]] == [e["event"] for e in events]


class SectionPlugin:
    """Declares `[hooktest]` and reads it when registering its runtime."""

    @hookimpl
    def config_sections(self, register: Callable[..., None]) -> None:
        def validate(section: dict[str, Any]) -> list[tuple[str, str]]:
            return [("level", "must be 1..10")] if not 1 <= section["level"] <= 10 else []

        register("hooktest", {"level": 3, "label": "plain"}, validate, doc="A test section.")

    @hookimpl
    def register_runtimes(self, register: Callable[[Any], None], config: Any) -> None:
        section = config.section("hooktest")
        register(EchoRuntime(label=f"{section['label']}:{section['level']}"))


async def test_config_sections_defaults_values_and_problems(make_gateway: Any, tmp_path: Path) -> None:
    # Defaults visible to the plugin (and through it, to clients).
    client = await make_gateway(extra_plugins=(SectionPlugin(),))
    agents = {a["agentId"]: a for a in (await (await client.get("/v1/agents")).json())["agents"]}
    assert agents["hook-echo"]["label"] == "plain:3"
    assert gateway_of(client).config.section("hooktest") == {"level": 3, "label": "plain"}

    # Values from the file and the environment.
    host = PluginHost.load(env={}, extra=(SectionPlugin(),))
    path = tmp_path / "gw.toml"
    path.write_text('[hooktest]\nlevel = 7\nlabel = "file"\n')
    config = Config.load(
        path, section_specs_from_hook(host.config_sections()), env={"AGENT_GATEWAY__HOOKTEST__LABEL": "env"}
    )
    assert config.section("hooktest") == {"level": 7, "label": "env"}
    assert config.problems() == []
    assert config.specs["hooktest"].doc == "A test section."

    # Its problems, in the one format, from `config.problems()` and `agent-gateway config check`.
    path.write_text('[hooktest]\nlevel = 99\ncolour = "red"\n')
    config = Config.load(path, section_specs_from_hook(host.config_sections()), env={})
    assert config.problems() == [f"{path}: hooktest.colour: unknown key", f"{path}: hooktest.level: must be 1..10"]


def test_config_sections_problems_reported_by_config_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("AGENT_GATEWAY")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(agent_gateway.cli.PluginHost, "load", classmethod(lambda cls: _load_with(SectionPlugin())))
    path = tmp_path / "gw.toml"
    path.write_text("[hooktest]\nlevel = 0\nlabel = 5\n")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"{path}: hooktest.label: expected str, got int",
        f"{path}: hooktest.level: must be 1..10",
    ]
    path.write_text('[hooktest]\nlevel = 5\nlabel = "fine"\n')
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)])
    assert (result.exit_code, result.output) == (0, f"{path}: ok\n")


_real_load = PluginHost.load


def _load_with(*extra: object) -> PluginHost:
    return _real_load(env={}, extra=extra)


class CommandPlugin:
    @hookimpl
    def register_commands(self, cli: click.Group) -> None:
        @cli.command("hello-hook")
        @click.option("--name", default="world")
        def hello(name: str) -> None:
            """Say hello from a plugin."""
            click.echo(f"hello {name} from a plugin command")


def test_register_commands_adds_a_runnable_command(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setattr(cli, "commands", dict(cli.commands))  # keep the shared group clean
    host = PluginHost.load(env={}, extra=(CommandPlugin(),))
    host.register_commands(cli)
    assert "hello-hook" in cli.commands
    result = CliRunner().invoke(cli, ["hello-hook", "--name", "tester"])
    assert (result.exit_code, result.output) == (0, "hello tester from a plugin command\n")
    assert "hello-hook" in CliRunner().invoke(cli, ["--help"]).output

    # The real launcher entry (`main`) registers plugin commands before parsing the command line.
    monkeypatch.setattr(cli, "commands", dict(cli.commands))
    cli.commands.pop("hello-hook")
    monkeypatch.setattr(agent_gateway.cli.PluginHost, "load", classmethod(lambda cls: _load_with(CommandPlugin())))
    monkeypatch.setattr("sys.argv", ["agent-gateway", "hello-hook"])
    with pytest.raises(SystemExit) as exit_info:
        agent_gateway.cli.main()
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == "hello world from a plugin command\n"


class LifecyclePlugin:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.contexts: list[Any] = []

    @hookimpl
    def gateway_startup(self, context: Any) -> Any:
        self.contexts.append(context)

        async def start() -> None:
            await asyncio.sleep(0)
            self.events.append("started")  # only if the core awaited the coroutine

        return start()

    @hookimpl
    def gateway_shutdown(self, context: Any) -> Any:
        self.contexts.append(context)

        async def stop() -> None:
            await asyncio.sleep(0)
            self.events.append("stopped")

        return stop()


class SyncLifecyclePlugin:
    def __init__(self) -> None:
        self.events: list[str] = []

    @hookimpl
    def gateway_startup(self, context: Any) -> None:
        self.events.append("started")

    @hookimpl
    def gateway_shutdown(self, context: Any) -> None:
        self.events.append("stopped")


async def test_gateway_startup_and_shutdown_are_awaited(tmp_path: Path) -> None:
    awaited, plain = LifecyclePlugin(), SyncLifecyclePlugin()
    host = PluginHost.load(env={}, extra=(awaited, plain))
    app = create_app(config_with(tmp_path), host)
    assert awaited.events == [] and plain.events == []
    async with TestClient(TestServer(app)) as client:
        assert awaited.events == ["started"] and plain.events == ["started"]
        [context] = awaited.contexts
        # A documented context, not the aiohttp application.
        assert isinstance(context, GatewayContext) and not isinstance(context, web.Application)
        assert context.data_dir == tmp_path / "data" and context.config.section("gateway") is not None
        context.state["seen"] = True
        assert (await client.get("/v1/health")).status == 200
    assert awaited.events == ["started", "stopped"]
    assert plain.events == ["started", "stopped"]
    assert awaited.contexts[1] is context and context.state == {"seen": True}  # the same for both


async def test_gateway_shutdown_runs_after_runtimes_closed(tmp_path: Path) -> None:
    runtime = EchoRuntime()
    seen: list[bool] = []

    class Observer:
        @hookimpl
        def gateway_shutdown(self, context: Any) -> None:
            seen.append(runtime.closed)

    host = PluginHost.load(env={}, extra=(RuntimePlugin(runtime), Observer()))
    async with TestClient(TestServer(create_app(config_with(tmp_path), host))) as client:
        created = await client.post("/v1/runs", json=run_body("x", agentId="hook-echo"))
        events = await read_stream(client, (await created.json())["hostRunId"])
        assert events[-1]["event"] == "run.completed"
    assert seen == [True]


# -- the facade's rules --------------------------------------------------------------------------------


def test_unknown_hook_is_rejected_at_load() -> None:
    class Typo:
        @hookimpl
        def register_runtime(self, register: Any, config: Any) -> None:  # missing "s"
            pass

    with pytest.raises(PluginError, match=r"unknown hook implemented: .*register_runtime"):
        PluginHost.load(env={}, extra=(Typo(),))
    host = PluginHost.load(env={}, builtins=False)
    with pytest.raises(PluginError, match="register_runtime"):
        host.register(Typo(), name="typo")
    assert host.pm.get_plugin("typo") is None  # not left half-registered


def test_hook_with_an_argument_the_spec_lacks_is_rejected_at_load() -> None:
    class WrongArgs:
        @hookimpl
        def storage_backend(self, url: str, config: Any, pool_size: int) -> Any:
            return None

    with pytest.raises(PluginError, match=r"(?s)'WrongArgs@\w+' breaks the hook contract: .*pool_size"):
        PluginHost.load(env={}, extra=(WrongArgs(),))


def test_builtins_always_load_and_load_plugins_filters_third_party_only() -> None:
    names = lambda host: {info.name for info in host.plugins()}  # noqa: E731
    assert BUILTIN_NAMES <= names(PluginHost.load(env={}))
    # The switch names third-party plugins: the built-ins stay whatever it says.
    assert BUILTIN_NAMES <= names(PluginHost.load(env={LOAD_ENV: "core"}))
    assert BUILTIN_NAMES <= names(PluginHost.load(env={LOAD_ENV: ""}))
    # A bare or partial host is an explicit choice of the caller (tests), not an env var.
    assert names(PluginHost.load(env={}, builtins={"core", "chat_only"})) == {"core", "chat_only"}
    assert names(PluginHost.load(env={}, builtins=False)) == set()
    # In-process plugins are not entry points: neither switch drops them.
    host = PluginHost.load(env={LOAD_ENV: ""}, builtins=False, extra=(RuntimePlugin(),))
    assert [info.hooks for info in host.plugins()] == [("register_runtimes",)]


def test_plugins_lists_distribution_and_hooks() -> None:
    infos = {info.name: info for info in PluginHost.load(env={}, extra=(CommandPlugin(),)).plugins()}
    assert infos["core"].distribution == "agent-gateway"
    assert infos["core"].hooks == (
        "authenticate",
        "authentication_enabled",
        "config_sections",
        "register_projections",
        "register_runtimes",
        "session_strategy",
    )
    assert infos["journal_peewee"].hooks == ("storage_backend",)
    assert infos["chat_only"].hooks == ("config_sections", "register_runtimes")
    [extra] = [i for i in infos.values() if i.hooks == ("register_commands",)]
    assert extra.distribution is None


def test_trace_hooks_env_prints_every_call_to_stderr(capsys: Any, tmp_path: Path) -> None:
    host = PluginHost.load(env={TRACE_ENV: "1"}, builtins={"core"}, extra=(RuntimePlugin(),))
    runtimes = host.runtimes(config_with(tmp_path))
    assert [r.agent_id for r in runtimes] == ["hook-echo"]
    host.session_strategy(runtimes[0], None)
    err = capsys.readouterr().err
    assert re.search(r"^\[hook\] register_runtimes\(register, config\) -> core, RuntimePlugin@\w+$", err, re.M), err
    assert "[hook] register_runtimes returned []" in err
    assert re.search(r"^\[hook\] session_strategy\(runtime, config\) -> core$", err, re.M), err
    assert "[hook] session_strategy returned <agent_gateway.sessions.TranscriptStrategy" in err

    quiet = PluginHost.load(env={TRACE_ENV: "0"}, builtins={"core"}, extra=(RuntimePlugin(),))
    quiet.runtimes(config_with(tmp_path))
    assert capsys.readouterr().err == ""


def test_builtin_defaults_are_trylast() -> None:
    """Every default a third party must be able to replace is marked trylast."""
    host = PluginHost.load(env={}, builtins={"core", "journal_peewee"})
    for hook_name, plugin_name in [
        ("session_strategy", "core"),
        ("register_projections", "core"),
        ("storage_backend", "journal_peewee"),
    ]:
        [impl] = [i for i in getattr(host.pm.hook, hook_name).get_hookimpls() if i.plugin_name == plugin_name]
        assert impl.trylast, f"{plugin_name}.{hook_name} must be trylast"


# -- the contract stays documented and tested -------------------------------------------------------


async def test_register_routes_serves_a_plugin_route_behind_actor_auth(make_gateway: Any) -> None:
    class Hello:
        @hookimpl
        def register_routes(self, routes: PluginRoutes) -> None:
            async def hello(request: web.Request) -> web.Response:
                actor = routes.actor(request)
                agent = routes.runtime("chat-only")
                return web.json_response({"actor": actor, "agent": agent.display_name if agent else None})

            routes.add("GET", "/v1/hello", hello, openapi={"summary": "Say hello", "responses": {}})

    client = await make_gateway(extra_plugins=(Hello(),), tokens={"tok-alice-0123456789": "alice"})
    assert (await client.get("/v1/hello")).status == 401  # authenticated like every core route
    response = await client.get("/v1/hello", headers={"Authorization": "Bearer tok-alice-0123456789"})
    assert response.status == 200
    assert await response.json() == {"actor": "alice", "agent": "Chat only"}
    # Declared with its route, the operation is in /openapi.json.
    spec = await (await client.get("/openapi.json")).json()
    assert spec["paths"]["/v1/hello"] == {"get": {"summary": "Say hello", "responses": {}}}


async def test_register_setting_fields_appear_in_descriptors_and_validate_preferences(make_gateway: Any) -> None:
    class Tone:
        @hookimpl
        def register_setting_fields(self, register: Callable[[dict[str, Any]], None], config: Any) -> None:
            register(
                {
                    "key": "ai.agent.*.tone",
                    "label": "Tone",
                    "kind": "select",
                    "default": "plain",
                    "options": ["plain", "formal"],
                }
            )

    client = await make_gateway(extra_plugins=(Tone(),))
    agents = (await (await client.get("/v1/agents")).json())["agents"]
    chat = next(a for a in agents if a["agentId"] == "chat-only")
    field = next(f for f in chat["fields"] if f["key"].endswith(".tone"))
    assert field["label"] == "Tone" and field["default"] == "plain"
    ok = await client.put("/v1/preferences", json={"values": {"ai.agent.chat-only.tone": "formal"}})
    assert ok.status == 200, await ok.text()
    bad = await client.put("/v1/preferences", json={"values": {"ai.agent.chat-only.tone": "shouty"}})
    assert bad.status == 400
    values = (await (await client.get("/v1/preferences")).json())["values"]
    assert values["ai.agent.chat-only.tone"] == "formal"


# Hooks tested in another module are named by node id (a test module never imports another).
IN_TEST_AUTH_HOOKS = "test_auth_hooks.py::"
IN_TEST_CLUSTER = "test_cluster.py::"
HOOKS_TESTED: dict[str, Callable[..., Any] | str] = {
    "register_runtimes": test_register_runtimes_agent_is_listed_and_runs_a_turn,
    "negotiate_runtime_policy": test_negotiate_runtime_policy_every_implementation_adjusts_the_policy,
    "sandbox_agent": test_sandbox_agent_first_plugin_confines_and_the_builtin_is_trylast,
    "session_strategy": test_session_strategy_decides_the_runs_session_mode,
    "register_tools": test_register_tools_collects_every_plugins_tools,
    "tool_call_veto": test_tool_call_veto_first_reason_wins,
    "tool_call_completed": test_tool_call_completed_every_observer_sees_the_receipt,
    "storage_backend": test_storage_backend_plugin_overrides_the_trylast_default,
    "register_projections": test_register_projections_selectable_on_events_and_stream,
    "config_sections": test_config_sections_defaults_values_and_problems,
    "register_commands": test_register_commands_adds_a_runnable_command,
    "gateway_startup": test_gateway_startup_and_shutdown_are_awaited,
    "gateway_shutdown": test_gateway_startup_and_shutdown_are_awaited,
    "register_routes": test_register_routes_serves_a_plugin_route_behind_actor_auth,
    "cluster_coordinator": IN_TEST_CLUSTER
    + "test_cluster_coordinator_hook_a_plugin_coordinator_sees_every_committed_event",
    "register_setting_fields": test_register_setting_fields_appear_in_descriptors_and_validate_preferences,
    "authenticate": IN_TEST_AUTH_HOOKS + "test_authenticate_a_plugins_actor_wins_and_static_tokens_are_tried_last",
    "authentication_enabled": IN_TEST_AUTH_HOOKS
    + "test_authentication_enabled_decides_whether_callers_must_authenticate",
    "authorize": IN_TEST_AUTH_HOOKS + "test_authorize_any_false_denies_with_403_and_none_abstains",
    "trace_run": test_trace_run_follows_a_run_from_its_receipt_to_its_end,
}


def test_every_hook_has_a_test_and_a_docstring() -> None:
    assert set(HOOKS_TESTED) == all_hook_names()
    for test in HOOKS_TESTED.values():
        if isinstance(test, str):
            filename, _, name = test.partition("::")
            tree = ast.parse((ROOT / "tests" / filename).read_text(encoding="utf-8"))
            defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
            assert name in defined, f"{test} is not a test in tests/{filename}"
    for module in SPEC_MODULES:
        for name in all_hook_names() & set(vars(module)):
            assert (getattr(module, name).__doc__ or "").strip(), f"{name} has no docstring"


def test_docs_hooks_has_one_entry_per_hook_with_its_signature() -> None:
    """docs/hooks.md is written by hand from the hookspecs; keep them in sync."""
    doc = (ROOT / "docs" / "hooks.md").read_text(encoding="utf-8")
    headings = re.findall(r"^### `(\w+)", doc, re.M)
    assert sorted(headings) == sorted(all_hook_names())
    for module in SPEC_MODULES:
        for name in all_hook_names() & set(vars(module)):
            spec = getattr(module, name)
            params = ", ".join(inspect.signature(spec).parameters)
            assert f"### `{name}({params})`" in doc, f"docs/hooks.md: {name}({params}) heading"
            firstresult = getattr(spec, f"{PROJECT_NAME}_spec").get("firstresult", False)
            section = doc.split(f"### `{name}(", 1)[1].split("\n### ", 1)[0]
            assert f"firstresult: {'yes' if firstresult else 'no'}" in section, f"docs/hooks.md: {name} firstresult"
