"""The MCP surface: the JSON-RPC server over the tool facade, lease tokens, ``POST /v1/mcp``, the
stdio bridge as a real subprocess against a real gateway server, and the official ``mcp`` Python
SDK as a client over both the bridge and HTTP.

Runs are kept active with a chat-only run whose (fake) LLM call hangs until the run is cancelled;
the tokens are run leases (:func:`agent_gateway.mcp.wiring.run_lease`) or binding leases over a stand-in
binding. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import agent_gateway.app as app_module
from agent_gateway.app import GATEWAY_KEY, Gateway, create_app
from agent_gateway.config import Config
from agent_gateway.hookspecs import hookimpl
from agent_gateway.mcp import MCP_PATH, TOKEN_ENV
from agent_gateway.mcp import http as mcp_http
from agent_gateway.mcp.bridge import endpoint_of
from agent_gateway.mcp.leases import NO_ACTIVE_RUN, UNKNOWN_TOKEN, LeaseError, McpLeases, run_pin
from agent_gateway.mcp.server import LATEST_PROTOCOL_VERSION, PROTOCOL_VERSIONS, McpServer
from agent_gateway.mcp.surface import McpSurface
from agent_gateway.mcp.wiring import (
    binding_lease,
    http_entry,
    run_lease,
    stdio_entry,
)
from agent_gateway.models import Run
from agent_gateway.plugin_host import PluginHost
from agent_gateway.runtime import RuntimePolicy
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from agent_gateway.tools import RunScope, Tool, ToolCall, ToolError, ToolFacade

WAIT = 20.0
ACTOR_TOKEN = "actor-secret-token"
NOTE_TEXT = "MCP note: the blue widget ships on Friday.\n"


# -- a small in-test tool set ---------------------------------------------------------------------


async def _echo(call: ToolCall) -> dict[str, Any]:
    return {"echo": call.arguments["text"], "actor": call.scope.actor_id, "workspace": call.scope.workspace_id}


async def _refuse(call: ToolCall) -> dict[str, Any]:
    raise ToolError("vetoed", "this tool always says no")


def test_tools() -> list[Tool]:
    return [
        Tool(
            "test.echo",
            "Echo the text back, with the caller's actor and workspace.",
            {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
            ("test.read",),
            _echo,
        ),
        Tool("test.refuse", "Always refused.", {"type": "object", "properties": {}}, ("test.read",), _refuse),
    ]


test_tools.__test__ = False  # type: ignore[attr-defined]  # not a test, a helper


class ToolPlugin:
    @hookimpl
    def register_tools(self, register: Callable[[Any], None], config: Any) -> None:
        for tool in test_tools():
            register(tool)


class ListStorage:
    def __init__(self) -> None:
        self.receipts: list[dict[str, Any]] = []

    def insert_receipt(self, receipt: dict[str, Any]) -> None:
        self.receipts.append(receipt)


def make_run(status: str = "running", **request: Any) -> Run:
    return Run(
        host_run_id="run_" + uuid.uuid4().hex[:12],
        request_id="r",
        agent_id="a",
        provider="p",
        session_id="s",
        actor_id="alice",
        workspace_id="ws",
        status=status,
        request={"message": "hi", "context": request.get("context", {}), "options": {}},
    )


def rpc(method: str, params: dict[str, Any] | None = None, request_id: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    if request_id is not None:
        message["id"] = request_id
    return message


# -- the JSON-RPC server ---------------------------------------------------------------------------


@pytest.fixture
def server_and_scope() -> tuple[McpServer, RunScope, ListStorage]:
    storage = ListStorage()
    facade = ToolFacade(test_tools(), None, storage, None, None)  # type: ignore[arg-type]
    return McpServer(facade), facade.scope_for(make_run()), storage


async def test_initialize_negotiates_the_protocol_version(server_and_scope: Any) -> None:
    server, scope, _ = server_and_scope
    for version in PROTOCOL_VERSIONS:
        answer = await server.handle(rpc("initialize", {"protocolVersion": version, "capabilities": {}}), scope)
        assert answer["result"]["protocolVersion"] == version
    answer = await server.handle(rpc("initialize", {"protocolVersion": "2099-01-01"}), scope)
    result = answer["result"]
    assert result["protocolVersion"] == LATEST_PROTOCOL_VERSION == "2025-11-25"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "agent-gateway"
    assert await server.handle(rpc("notifications/initialized", request_id=None), scope) is None
    assert (await server.handle(rpc("ping", request_id="p"), scope)) == {"jsonrpc": "2.0", "id": "p", "result": {}}
    # Reasonix probes server/discover first and expects "method not found".
    answer = await server.handle(rpc("server/discover", {}, 7), scope)
    assert answer["id"] == 7 and answer["error"]["code"] == -32601
    answer = await server.handle(rpc("resources/list", {}, 8), scope)
    assert answer["error"]["code"] == -32601


async def test_invalid_messages_and_batches(server_and_scope: Any) -> None:
    server, scope, _ = server_and_scope
    assert (await server.handle({"id": 1, "method": "ping"}, scope))["error"]["code"] == -32600
    assert (await server.handle(rpc("ping", request_id={"no": 1}), scope))["error"]["code"] == -32600
    assert (await server.handle({"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}, scope))["error"][
        "code"
    ] == -32602
    assert (await server.handle([], scope))["error"]["code"] == -32600
    assert await server.handle({"jsonrpc": "2.0", "id": 3, "result": {}}, scope) is None  # a client response
    batch = [rpc("ping", request_id=1), rpc("notifications/initialized", request_id=None), rpc("tools/list", {}, 2)]
    answers = await server.handle(batch, scope)
    assert [a["id"] for a in answers] == [1, 2]
    assert await server.handle([rpc("notifications/cancelled", {"requestId": 1}, None)], scope) is None


async def test_tools_list_and_call(server_and_scope: Any) -> None:
    server, scope, storage = server_and_scope
    listed = (await server.handle(rpc("tools/list", {}), scope))["result"]["tools"]
    assert [t["name"] for t in listed] == ["test.echo", "test.refuse"]
    assert listed[0]["inputSchema"]["required"] == ["text"]

    answer = await server.handle(rpc("tools/call", {"name": "test.echo", "arguments": {"text": "hi"}}, 2), scope)
    result = answer["result"]
    assert result["isError"] is False
    structured = result["structuredContent"]
    assert structured["echo"] == "hi" and structured["actor"] == "alice" and structured["workspace"] == "ws"
    assert structured["receiptId"].startswith("rcpt_")
    assert json.loads(result["content"][0]["text"]) == structured
    assert storage.receipts[-1]["caller"] == "mcp" and storage.receipts[-1]["allowed"] is True

    refused = (await server.handle(rpc("tools/call", {"name": "test.refuse"}, 3), scope))["result"]
    assert refused["isError"] is True
    assert refused["content"] == [{"type": "text", "text": "vetoed: this tool always says no"}]
    assert "structuredContent" not in refused
    assert storage.receipts[-1]["allowed"] is False and storage.receipts[-1]["errorCode"] == "vetoed"

    unknown = (await server.handle(rpc("tools/call", {"name": "nope", "arguments": {}}, 4), scope))["result"]
    assert unknown["isError"] is True and unknown["content"][0]["text"].startswith("unknown_tool: ")
    bad = (await server.handle(rpc("tools/call", {"name": "test.echo", "arguments": {"text": 5}}, 5), scope))["result"]
    assert bad["isError"] is True and bad["content"][0]["text"].startswith("invalid_arguments: ")
    no_name = await server.handle(rpc("tools/call", {"arguments": {}}, 6), scope)
    assert no_name["error"]["code"] == -32602


# -- leases ------------------------------------------------------------------------------------------


def test_leases_resolve_only_while_a_run_is_active() -> None:
    facade = ToolFacade(test_tools(), None, ListStorage(), None, None)  # type: ignore[arg-type]
    leases = McpLeases(facade.scope_for)
    current: dict[str, Run | None] = {"run": None}
    holder_alive = {"alive": True}
    run = make_run(context={"allowedRoots": ["notes/"]})
    token = leases.issue("holder", lambda: current["run"], alive=lambda: holder_alive["alive"], pin=run_pin(run))
    assert len(token) >= 43  # 32 random bytes, URL-safe base64
    assert leases.issue("holder", lambda: current["run"], alive=lambda: holder_alive["alive"]) == token

    with pytest.raises(LeaseError) as info:
        leases.resolve(token)
    assert info.value.reason == "no_active_run" and str(info.value) == NO_ACTIVE_RUN

    current["run"] = run
    scope = leases.resolve(token)
    assert scope.run is run and scope.allowed_roots == ["notes/"] and scope.actor_id == "alice"

    other = make_run(context={"allowedRoots": ["private/"]})  # another scope than the one pinned
    current["run"] = other
    with pytest.raises(LeaseError) as info:
        leases.resolve(token)
    assert info.value.reason == "scope_mismatch"

    current["run"] = run
    run.status = "completed"
    with pytest.raises(LeaseError):
        leases.resolve(token)

    for wrong in (None, "", token[:-1], token + "x", "Bearer " + token):
        with pytest.raises(LeaseError) as info:
            leases.resolve(wrong)
        assert info.value.reason == "unknown_token" and str(info.value) == UNKNOWN_TOKEN

    holder_alive["alive"] = False
    with pytest.raises(LeaseError) as info:
        leases.resolve(token)
    assert info.value.reason == "unknown_token"
    assert len(leases) == 0
    assert leases.issue("holder", lambda: None) != token  # a new holder under the same key: a new token
    assert leases.revoke_key("holder") and len(leases) == 0


class StandInBinding:
    """What :func:`binding_lease` reads of an ACP binding."""

    def __init__(self) -> None:
        self.turn: Any = None
        self.busy = False
        self.alive = True
        self.agent_session_id = "agent-session-1"


class StandInTurn:
    def __init__(self, run: Run, binding: StandInBinding) -> None:
        self.run = run
        self.binding = binding


def test_binding_lease_follows_the_binding_across_runs() -> None:
    facade = ToolFacade(test_tools(), None, ListStorage(), None, None)  # type: ignore[arg-type]
    mcp = McpSurface(facade, lambda: [], lambda: None)
    binding = StandInBinding()
    first = StandInTurn(make_run(), binding)
    binding.busy = True  # bind(): the binding is being opened for `first`; binding.turn is not set yet
    token = binding_lease(mcp, first)  # type: ignore[arg-type]
    leases = mcp.leases
    scope = leases.resolve(token)
    assert scope.run is first.run and scope.agent_session_id == "agent-session-1"

    binding.turn = first  # run_turn()
    assert leases.resolve(token).run is first.run
    binding.turn, binding.busy = None, False  # the turn ended; the binding stays
    first.run.status = "completed"
    with pytest.raises(LeaseError, match="no active run"):
        leases.resolve(token)

    second = StandInTurn(make_run(), binding)  # the next run on the same live binding
    binding.turn, binding.busy = second, True
    assert leases.resolve(token).run is second.run
    assert binding_lease(mcp, second) == token  # (a session/load on the same binding)

    binding.alive = False  # the agent process is gone
    with pytest.raises(LeaseError, match="unknown or revoked"):
        leases.resolve(token)
    ref = weakref.ref(binding)
    del binding, first, second
    gc.collect()  # (binding.turn ⇄ turn.binding is a cycle)
    assert ref() is None  # the lease does not keep a closed binding alive


def test_entries_for_acp(tmp_path: Path) -> None:
    http = http_entry("http://127.0.0.1:9/", "s3cr3t-lease")
    assert http == {
        "type": "http",
        "name": "gateway",
        "url": "http://127.0.0.1:9/v1/mcp",
        "headers": [{"name": "Authorization", "value": "Bearer s3cr3t-lease"}],
    }
    stdio = stdio_entry("http://127.0.0.1:9", "s3cr3t-lease")
    assert stdio["command"] == sys.executable
    assert stdio["args"] == ["-m", "agent_gateway.mcp.bridge", "--url", "http://127.0.0.1:9", "--token-env", TOKEN_ENV]
    assert "s3cr3t-lease" not in " ".join(stdio["args"])
    assert stdio["env"] == [{"name": TOKEN_ENV, "value": "s3cr3t-lease"}]
    assert endpoint_of("http://h:1/") == "http://h:1/v1/mcp" == endpoint_of("http://h:1/v1/mcp")


# -- a real gateway with the MCP route ------------------------------------------------------------


def mount_mcp(app: Any, gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """What create_app will do: the /v1/mcp route, outside the actor auth, and the provider."""
    mcp_http.setup(app, gateway.mcp)
    if MCP_PATH not in app_module.PUBLIC_PATHS:
        monkeypatch.setattr(app_module, "PUBLIC_PATHS", app_module.PUBLIC_PATHS | {MCP_PATH})


@pytest.fixture
async def mcp_gateway(
    fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[TestClient]:
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "today.md").write_text(NOTE_TEXT)
    config = Config.load(
        None,
        env={},
        overrides={
            "gateway": {"data_dir": str(tmp_path / "data")},
            "chat_only": {"base_url": fake_llm.base_url, "model": "m"},
            "auth": {"tokens": {ACTOR_TOKEN: "alice"}},
            "workspaces": {"roots": {"ws": str(ws)}},
            "reasonix": {"enabled": False},
            "hermes": {"enabled": False},
        },
    )
    plugins = PluginHost.load(env={}, extra=(ToolPlugin(),))
    app = create_app(config, plugins)
    gateway = app[GATEWAY_KEY]
    # The chat-only runtime stands in for an agent that holds a run open; a tool-less agent's
    # runs get every tool capability switched off, so let this one reach tools.
    chat = gateway.runtimes["chat-only"]
    described = chat.describe
    monkeypatch.setattr(chat, "describe", lambda: {**described(), "toolAccess": True})
    mount_mcp(app, gateway, monkeypatch)
    client = TestClient(TestServer(app))
    await client.start_server()
    gateway.set_public_url(str(client.make_url("")))
    try:
        yield client
    finally:
        await client.close()


def gw(client: TestClient) -> Gateway:
    return client.app[GATEWAY_KEY]  # type: ignore[index]


ActiveRun = Callable[..., Awaitable[Run]]


@pytest.fixture
def active_run(mcp_gateway: TestClient, fake_llm: FakeOpenAI) -> ActiveRun:
    """Start a chat-only run (actor alice, workspace ws, roots notes/) that stays active: its LLM
    call hangs until the run is cancelled."""

    async def start(session_id: str | None = None) -> Run:
        fake_llm.add(Reply(hang=True))
        seen = len(fake_llm.requests)
        body = {
            "requestId": "req-" + uuid.uuid4().hex[:8],
            "agentId": "chat-only",
            "sessionId": session_id or "s-" + uuid.uuid4().hex[:8],
            "workspaceId": "ws",
            "message": "hold on",
            "context": {"allowedRoots": ["notes/"]},
        }
        response = await mcp_gateway.post("/v1/runs", json=body, headers={"Authorization": f"Bearer {ACTOR_TOKEN}"})
        assert response.status == 201, await response.text()
        run_id = (await response.json())["hostRunId"]
        await fake_llm.wait_for_requests(seen + 1, timeout=WAIT)  # the run is in its LLM call now
        return next(r for r in gw(mcp_gateway).runs.active_runs() if r.host_run_id == run_id)

    return start


async def end_run(client: TestClient, run: Run) -> None:
    response = await client.post(
        f"/v1/runs/{run.host_run_id}/cancel", headers={"Authorization": f"Bearer {ACTOR_TOKEN}"}
    )
    assert response.status in (200, 202), await response.text()
    async with asyncio.timeout(WAIT):
        await gw(client).runs.wait(run.host_run_id)
    assert run.is_terminal


async def post_mcp(client: TestClient, message: Any, token: str | None, **headers: str) -> tuple[int, Any, Any]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    response = await client.post(MCP_PATH, data=json.dumps(message), headers=headers)
    text = await response.text()
    return response.status, (json.loads(text) if text else None), response.headers


async def test_http_endpoint_auth_and_protocol(mcp_gateway: TestClient, active_run: ActiveRun) -> None:
    run = await active_run()
    token = run_lease(gw(mcp_gateway).mcp, run)

    for bad in (None, "wrong-token", ACTOR_TOKEN):  # the actor token is no MCP credential
        status, body, headers = await post_mcp(mcp_gateway, rpc("tools/list", {}, 1), bad)
        assert status == 401, (bad, body)
        assert body["error"]["code"] == -32001 and body["id"] == 1
        assert headers["WWW-Authenticate"].startswith("Bearer")
    # And the lease token is no actor credential.
    response = await mcp_gateway.get("/v1/runs/" + run.host_run_id, headers={"Authorization": f"Bearer {token}"})
    assert response.status == 401

    status, body, headers = await post_mcp(mcp_gateway, rpc("initialize", {"protocolVersion": "2025-06-18"}), token)
    assert status == 200 and body["result"]["protocolVersion"] == "2025-06-18"
    session_id = headers["Mcp-Session-Id"]
    status, body, _ = await post_mcp(mcp_gateway, rpc("notifications/initialized", request_id=None), token)
    assert status == 202 and body is None
    status, body, _ = await post_mcp(mcp_gateway, rpc("tools/list", {}, 2), token, **{"Mcp-Session-Id": session_id})
    names = [t["name"] for t in body["result"]["tools"]]
    assert {"test.echo", "workspace.read_file", "workspace.describe_roots"} <= set(names)
    status, body, _ = await post_mcp(mcp_gateway, rpc("ping", {}, 3), token, **{"Mcp-Session-Id": "made-up"})
    assert status == 404 and body["error"]["code"] == -32600

    batch = [
        rpc("tools/call", {"name": "workspace.read_file", "arguments": {"path": "notes/today.md"}}, 4),
        rpc("tools/call", {"name": "workspace.read_file", "arguments": {"path": "../outside.md"}}, 5),
        rpc("notifications/progress", {}, None),
    ]
    status, body, _ = await post_mcp(mcp_gateway, batch, token)
    assert status == 200 and [a["id"] for a in body] == [4, 5]
    assert body[0]["result"]["isError"] is False
    assert body[0]["result"]["structuredContent"]["text"] == NOTE_TEXT
    assert body[1]["result"]["isError"] is True and body[1]["result"]["content"][0]["text"].startswith("path_refused")

    status, body, _ = await post_mcp(mcp_gateway, "not an object", token)
    assert status == 400
    response = await mcp_gateway.post(MCP_PATH, data=b"{not json", headers={"Authorization": f"Bearer {token}"})
    assert response.status == 400 and (await response.json())["error"]["code"] == -32700
    response = await mcp_gateway.get(MCP_PATH, headers={"Authorization": f"Bearer {token}"})
    assert response.status == 405

    # The calls are the run's: tool events in its journal, receipts for its actor and workspace.
    receipts = await (
        await mcp_gateway.get(
            f"/v1/runs/{run.host_run_id}/receipts", headers={"Authorization": f"Bearer {ACTOR_TOKEN}"}
        )
    ).json()
    assert [(r["tool"], r["allowed"], r["caller"]) for r in receipts["receipts"]] == [
        ("workspace.read_file", True, "mcp"),
        ("workspace.read_file", False, "mcp"),
    ]
    assert {(r["actorId"], r["workspaceId"]) for r in receipts["receipts"]} == {("alice", "ws")}

    response = await mcp_gateway.delete(
        MCP_PATH, headers={"Authorization": f"Bearer {token}", "Mcp-Session-Id": session_id}
    )
    assert response.status == 204

    await end_run(mcp_gateway, run)
    status, body, _ = await post_mcp(mcp_gateway, rpc("tools/list", {}, 9), token)
    assert status == 401 and body["error"]["code"] == -32001 and body["id"] == 9
    status, body, _ = await post_mcp(mcp_gateway, [rpc("ping", {}, 10), rpc("ping", {}, 11)], token)
    assert status == 401 and [e["error"]["code"] for e in body] == [-32001, -32001]


async def test_mcp_servers_for_gives_http_or_stdio(mcp_gateway: TestClient, active_run: ActiveRun) -> None:
    gateway = gw(mcp_gateway)
    run = await active_run()
    turn = StandInTurn(run, StandInBinding())
    turn.binding.turn = turn
    provide = gateway.turn_services.mcp_servers_for
    assert provide is not None and gateway.public_url is not None
    [entry] = provide(turn, RuntimePolicy(mcp_http=True))
    assert entry["type"] == "http" and entry["url"] == gateway.public_url + MCP_PATH
    token = entry["headers"][0]["value"].removeprefix("Bearer ")
    [stdio] = provide(turn, RuntimePolicy())
    assert stdio["env"] == [{"name": TOKEN_ENV, "value": token}]  # one lease per binding
    status, body, _ = await post_mcp(mcp_gateway, rpc("tools/list", {}, 1), token)
    assert status == 200 and body["result"]["tools"]
    await end_run(mcp_gateway, run)
    turn.binding.turn = None
    status, body, _ = await post_mcp(mcp_gateway, rpc("tools/list", {}, 1), token)
    assert status == 401 and body["error"]["message"] == NO_ACTIVE_RUN
    gateway.public_url = None
    assert provide(turn, RuntimePolicy()) == []  # without its own URL the gateway offers nothing


async def test_session_lease_for_a_runtime_without_a_binding(mcp_gateway: TestClient, active_run: ActiveRun) -> None:
    """Pi asks for its MCP servers while spawning, before its binding exists: the lease then
    follows the gateway session's running run of that agent."""
    gateway = gw(mcp_gateway)
    first = await active_run("s-pi")
    turn = StandInTurn(first, None)  # type: ignore[arg-type]
    provide = gateway.turn_services.mcp_servers_for
    assert provide is not None
    [entry] = provide(turn, RuntimePolicy(mcp_http=True))
    token = entry["headers"][0]["value"].removeprefix("Bearer ")
    call = rpc("tools/call", {"name": "test.echo", "arguments": {"text": "one"}}, 1)
    status, body, _ = await post_mcp(mcp_gateway, call, token)
    assert status == 200 and body["result"]["structuredContent"]["echo"] == "one"
    await end_run(mcp_gateway, first)
    status, body, _ = await post_mcp(mcp_gateway, call, token)
    assert status == 401 and body["error"]["message"] == NO_ACTIVE_RUN

    other = await active_run("s-other")  # another session's run is not this token's
    status, body, _ = await post_mcp(mcp_gateway, call, token)
    assert status == 401
    await end_run(mcp_gateway, other)

    second = await active_run("s-pi")  # the session's next run: same token, attributed to it
    status, body, _ = await post_mcp(mcp_gateway, call, token)
    assert status == 200
    assert [r["hostRunId"] for r in gateway.storage.list_receipts(second.host_run_id)] == [second.host_run_id]
    assert len(gateway.storage.list_receipts(first.host_run_id)) == 1
    await end_run(mcp_gateway, second)


# -- the stdio bridge, a real subprocess -------------------------------------------------------------


class BridgeProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self) -> Any:
        assert self.process.stdout is not None
        async with asyncio.timeout(WAIT):
            line = await self.process.stdout.readline()
        assert line, "the bridge closed its stdout"
        return json.loads(line)

    async def ask(self, message: Any) -> Any:
        await self.send(message)
        return await self.receive()

    async def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        async with asyncio.timeout(WAIT):
            return await self.process.wait()


async def start_bridge(url: str, token: str | None) -> BridgeProcess:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if token is not None:
        env[TOKEN_ENV] = token
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_gateway.mcp.bridge",
        "--url",
        url,
        "--token-env",
        TOKEN_ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    return BridgeProcess(process)


async def test_stdio_bridge_relays_to_the_gateway(mcp_gateway: TestClient, active_run: ActiveRun) -> None:
    gateway = gw(mcp_gateway)
    run = await active_run()
    token = run_lease(gateway.mcp, run)
    assert gateway.public_url is not None
    bridge = await start_bridge(gateway.public_url, token)
    try:
        answer = await bridge.ask(rpc("server/discover", {}, 0))
        assert answer["error"]["code"] == -32601
        answer = await bridge.ask(rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}}, 1))
        assert answer["result"]["protocolVersion"] == "2025-11-25"
        await bridge.send(rpc("notifications/initialized", request_id=None))  # no answer expected
        answer = await bridge.ask(rpc("tools/list", {}, 2))
        assert answer["id"] == 2 and "workspace.read_file" in [t["name"] for t in answer["result"]["tools"]]
        answer = await bridge.ask(
            rpc("tools/call", {"name": "workspace.read_file", "arguments": {"path": "notes/today.md"}}, "c-3")
        )
        assert answer["id"] == "c-3" and answer["result"]["structuredContent"]["text"] == NOTE_TEXT
        answer = await bridge.ask([rpc("ping", {}, 4), rpc("tools/call", {"name": "test.refuse"}, 5)])
        assert [a["id"] for a in answer] == [4, 5] and answer[1]["result"]["isError"] is True
        await bridge.send("{broken")  # a JSON string that is no message: the gateway answers invalid request
        assert (await bridge.receive())["error"]["code"] == -32600
        bridge.process.stdin.write(b"{not json\n")  # type: ignore[union-attr]
        assert (await bridge.receive())["error"]["code"] == -32700

        await end_run(mcp_gateway, run)
        answer = await bridge.ask(rpc("tools/list", {}, 6))
        assert answer == {"jsonrpc": "2.0", "id": 6, "error": {"code": -32001, "message": UNKNOWN_TOKEN}}
    finally:
        status = await bridge.close()
    assert status == 0


async def test_stdio_bridge_without_a_gateway_or_a_token(unused_tcp_port: int) -> None:
    bridge = await start_bridge(f"http://127.0.0.1:{unused_tcp_port}", "some-token")
    answer = await bridge.ask(rpc("initialize", {"protocolVersion": "2025-11-25"}, 1))
    assert answer["id"] == 1 and answer["error"]["code"] == -32000
    assert "cannot reach the agent gateway" in answer["error"]["message"]
    await bridge.send(rpc("notifications/initialized", request_id=None))  # no answer, no hang
    answer = await bridge.ask(rpc("ping", {}, 2))
    assert answer["id"] == 2 and answer["error"]["code"] == -32000
    assert await bridge.close() == 0

    bridge = await start_bridge(f"http://127.0.0.1:{unused_tcp_port}", None)
    async with asyncio.timeout(WAIT):
        status = await bridge.process.wait()
        stderr = await bridge.process.stderr.read()  # type: ignore[union-attr]
    assert status == 2 and TOKEN_ENV.encode() in stderr


def test_bridge_token_never_in_argv() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent_gateway.mcp.bridge", "--help"],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0 and "--token-env" in done.stdout and "--token " not in done.stdout


# -- the official MCP SDK as the client --------------------------------------------------------------


async def test_official_mcp_client_over_the_bridge_and_http(mcp_gateway: TestClient, active_run: ActiveRun) -> None:
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    gateway = gw(mcp_gateway)
    run = await active_run()
    token = run_lease(gateway.mcp, run)
    base_url = gateway.public_url

    async def exercise(client: Client) -> None:
        tools = await client.list_tools()
        names = {t.name for t in tools.tools}
        assert {"test.echo", "workspace.read_file"} <= names
        result = await client.call_tool("workspace.read_file", {"path": "notes/today.md"})
        assert result.is_error is False
        assert result.structured_content["text"] == NOTE_TEXT
        refused = await client.call_tool("workspace.read_file", {"path": "/etc/passwd"})
        assert refused.is_error is True and refused.content[0].text.split(":")[0] in ("path_refused", "outside_roots")

    # stdio: the SDK starts the bridge (mode "auto" probes server/discover first, like Reasonix).
    command, args = stdio_entry(base_url, token)["command"], stdio_entry(base_url, token)["args"]
    params = StdioServerParameters(command=command, args=args, env={TOKEN_ENV: token})
    async with asyncio.timeout(WAIT * 2):
        async with Client(params, read_timeout_seconds=WAIT) as client:
            assert client.protocol_version in PROTOCOL_VERSIONS
            await exercise(client)

    # streamable HTTP with the lease token in the Authorization header.
    async with asyncio.timeout(WAIT * 2):
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            transport = streamable_http_client(base_url + MCP_PATH, http_client=http)
            async with Client(transport, read_timeout_seconds=WAIT) as client:
                assert client.protocol_version == LATEST_PROTOCOL_VERSION
                await exercise(client)

    receipts = gateway.storage.list_receipts(run.host_run_id)
    assert len(receipts) == 4 and {r["caller"] for r in receipts} == {"mcp"}
    await end_run(mcp_gateway, run)
