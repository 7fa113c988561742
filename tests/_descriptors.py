"""Helpers for agent descriptor and preference tests: a tool-using test agent, a gateway
factory with two actors (`make_client`) and preference writes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import agent_gateway.plugins.lightrag as lightrag_plugin
from agent_gateway import hookspecs
from agent_gateway.app import GATEWAY_KEY, create_app
from agent_gateway.config import Config
from agent_gateway.hookspecs import descriptors as descriptor_specs
from agent_gateway.hookspecs import hookimpl
from agent_gateway.hookspecs import routes as route_specs
from agent_gateway.plugin_host import PluginHost
from agent_gateway.runtime import RuntimePolicy, Turn, TurnOutcome
from agent_gateway.tools import ToolError

BASE_PLUGINS = "core,journal_peewee,chat_only,workspace"


TOKENS = {"alice-token-0123456789": "alice", "bob-token-0123456789ab": "bob"}


ALICE = {"Authorization": "Bearer alice-token-0123456789"}


BOB = {"Authorization": "Bearer bob-token-0123456789ab"}


def plugin_host(*extra: object) -> PluginHost:
    """The built-in plugins plus lightrag and ``extra``, with the two new hook families declared
    even before hookspecs/__init__.py lists them."""
    host = PluginHost.load(env={}, builtins=BASE_PLUGINS.split(","))
    for spec in (descriptor_specs, route_specs):
        if spec not in hookspecs.SPEC_MODULES:
            host.pm.add_hookspecs(spec)
    for plugin in (lightrag_plugin, *extra):
        host.register(plugin)
    return host


def build_app(config: Config, host: PluginHost) -> web.Application:
    """create_app, plus the plugin routes when app.py does not add them yet."""
    app = create_app(config, host)
    gateway = app[GATEWAY_KEY]
    paths = {getattr(r.resource, "canonical", None) for r in app.router.routes()}
    if "/v1/knowledge/status" not in paths:
        host.pm.hook.register_routes(app=app, gateway=gateway)
    return app


class ToolAgent:
    """A runtime with tool access: its message is a tool name; it calls that tool through the
    facade with the run's server-resolved scope, as an MCP call would, and reports the result."""

    display_name = "Tool agent"
    provider = "test"

    def __init__(self, agent_id: str = "tool-agent", arguments: dict[str, Any] | None = None) -> None:
        self.agent_id = agent_id
        self.policy = RuntimePolicy(context_carrier="transcript_rebuild", mcp_http=True)
        self.arguments = arguments or {}

    def describe(self) -> dict[str, Any]:
        return {
            "capabilities": ["chat", "tools"],
            "availability": {"available": True},
            "fields": [
                {"key": "model", "label": "Model", "kind": "string", "default": "m"},
                {"key": "apiKey", "label": "API key", "kind": "string", "default": "", "secret": True},
                {"key": "debugTrace", "label": "Debug trace", "kind": "boolean", "default": False, "auth": "admin"},
            ],
        }

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        tools = turn.tools
        assert tools is not None
        scope = tools.scope_for(turn.run)  # with the capabilities resolved as off when the run started
        name = turn.message.strip()
        await turn.emit("tool.started", {"toolCallId": "call_1", "title": name, "rawInput": self.arguments}, "agent")
        try:
            result = await tools.call(name, dict(self.arguments), scope, caller="mcp")
        except ToolError as exc:
            await turn.emit(
                "tool.completed", {"toolCallId": "call_1", "status": "failed", "error": exc.to_wire()}, "agent"
            )
            await turn.emit("message.completed", {"text": f"the tool failed: {exc.code}: {exc.message}"})
            return TurnOutcome("completed")
        await turn.emit("tool.completed", {"toolCallId": "call_1", "status": "completed", "result": result}, "agent")
        citations = result.get("citations") or []
        await turn.emit("message.completed", {"text": "done. " + " ".join(citations)})
        return TurnOutcome("completed")

    async def close(self) -> None:
        return None


class ToolAgentPlugin:
    def __init__(self, *runtimes: ToolAgent) -> None:
        self.runtimes = runtimes

    @hookimpl
    def register_runtimes(self, register: Callable[[Any], None], config: Any) -> None:
        for runtime in self.runtimes:
            register(runtime)


MakeClient = Callable[..., Awaitable[TestClient]]


@pytest.fixture(name="make_client")
async def make_client_fixture(tmp_path: Path) -> AsyncIterator[MakeClient]:
    clients: list[TestClient] = []

    async def factory(
        *,
        tokens: dict[str, str] | None = TOKENS,
        admins: list[str] | None = None,
        overrides: dict[str, dict[str, Any]] | None = None,
        extra: tuple[object, ...] = (),
    ) -> TestClient:
        data = tmp_path / f"gw{len(clients)}"
        ws = tmp_path / "ws"
        ws.mkdir(exist_ok=True)
        sections: dict[str, dict[str, Any]] = {
            "gateway": {"data_dir": str(data)},
            "chat_only": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
            "workspaces": {"roots": {"local:test": str(ws)}},
            "lightrag": {"url": "http://127.0.0.1:9"},
        }
        if tokens:
            sections["auth"] = {"tokens": dict(tokens)}
        for name, values in (overrides or {}).items():
            sections.setdefault(name, {}).update(values)
        config = Config.load(None, env={}, overrides=sections)
        if admins is not None:  # [auth] admins: set directly until gateway/config.py declares it
            config.env_overrides.setdefault("auth", {})["admins"] = list(admins)
        client = TestClient(TestServer(build_app(config, plugin_host(*extra))))
        await client.start_server()
        clients.append(client)
        return client

    try:
        yield factory
    finally:
        for client in reversed(clients):
            await client.close()


async def agents_of(client: TestClient, headers: dict[str, str]) -> dict[str, dict[str, Any]]:
    response = await client.get("/v1/agents", headers=headers)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["schema"] == "gateway.agent_descriptors.v1"
    return {a["agentId"]: a for a in body["agents"]}


async def put_prefs(client: TestClient, headers: dict[str, str], values: dict[str, Any], status: int = 200) -> Any:
    response = await client.put("/v1/preferences", json={"values": values}, headers=headers)
    assert response.status == status, await response.text()
    return await response.json()
