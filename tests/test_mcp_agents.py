"""A real ACP agent calling a gateway tool through the gateway's MCP surface.

The real Reasonix (``REASONIX_BIN``, else ``${AGENT_GATEWAY_PEERS_DIR}/bin/reasonix``; installed by
``contrib/peers/install.sh``) runs behind the real gateway HTTP API, on the contrib fake OpenAI
server, with ``HOME`` in a tmp dir. The gateway gives it its MCP server in ``session/new``
(streamable HTTP: Reasonix declares ``mcpCapabilities.http``; and the stdio bridge when the
policy says no HTTP). The scripted model calls ``workspace.read_file`` through Reasonix's
``use_capability`` proxy; the test checks the run's ``tool.*`` events (source ``tool``), the
receipt, that the file text reached the model, and that the lease held by the live binding is
refused between runs and still works for the binding's next run. A missing binary is a failure,
not a skip.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent_gateway.acp.runtime import AcpRuntime
from agent_gateway.app import GATEWAY_KEY, Gateway, create_app
from agent_gateway.config import Config
from agent_gateway.mcp import MCP_PATH
from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.plugin_host import PluginHost
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import sse_events
from tests._real_agents import agent_binary, last_user_text, message_text

pytestmark = pytest.mark.peers

TURN_TIMEOUT = 90.0
NOTE = "notes/widget.md"
NOTE_TEXT = "The blue widget ships on Friday (MCP test note 7f3a).\n"
READ_ARGS = {"path": NOTE}


def tool_messages(body: dict[str, Any]) -> list[str]:
    return [message_text(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "tool"]


class Model:
    """The scripted LLM: on the trigger message, first a call of the gateway's read tool through
    Reasonix's `use_capability` proxy, then (once the tool result is in) a final answer."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        fake.default = self
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> Reply:
        if not body.get("stream"):
            return Reply(text="A short test conversation")
        text = last_user_text(body)
        if tool_messages(body) and body["messages"][-1].get("role") == "tool":
            return Reply(text="The note says the widget ships on Friday.")
        if "read the widget note" in text:
            self.calls += 1
            call_id = f"call_{self.calls}"
            arguments = {
                "action": "call",
                "capability_id": "mcp-tool:gateway/workspace.read_file",
                "arguments": READ_ARGS,
            }
            return Reply(tool_calls=[{"id": call_id, "name": "use_capability", "arguments": arguments}])
        return Reply(text="ok")


@pytest.fixture
async def reasonix_gateway(
    fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[TestClient]:
    binary = agent_binary("reasonix")
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / NOTE).write_text(NOTE_TEXT)
    (ws / "private").mkdir()
    (ws / "private" / "secret.md").write_text("not for agents\n")
    home = tmp_path / "agent-home"
    home.mkdir()
    config = Config.load(
        None,
        env={},
        overrides={
            "gateway": {"data_dir": str(tmp_path / "data")},
            "chat_only": {"base_url": fake_llm.base_url, "model": "m"},
            "workspaces": {"roots": {"ws": str(ws)}},
            "reasonix": {
                "command": [binary, "acp"],
                "env": {"HOME": str(home)},
                "provider_base_url": fake_llm.base_url,
                "provider_model": "m",
            },
            "hermes": {"enabled": False},
        },
    )
    app = create_app(config, PluginHost.load(env={}))
    gateway = app[GATEWAY_KEY]
    client = TestClient(TestServer(app))
    await client.start_server()
    gateway.set_public_url(str(client.make_url("")))
    try:
        yield client
    finally:
        await client.close()


def gw(client: TestClient) -> Gateway:
    return client.app[GATEWAY_KEY]  # type: ignore[index]


async def run_turn(client: TestClient, session_id: str, message: str) -> tuple[str, list[dict[str, Any]]]:
    body = {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": "reasonix",
        "sessionId": session_id,
        "workspaceId": "ws",
        "message": message,
        "context": {"allowedRoots": ["notes/"]},
    }
    response = await client.post("/v1/runs", json=body)
    assert response.status == 201, await response.text()
    run_id = str((await response.json())["hostRunId"])
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(TURN_TIMEOUT):
        async with client.get(f"/v1/runs/{run_id}/stream") as stream:
            assert stream.status == 200, await stream.text()
            async for sse in sse_events(stream):
                events.append(sse["data"])
    assert events and events[-1]["kind"] in TERMINAL_KINDS, [e["kind"] for e in events]
    return run_id, events


def lease_token(client: TestClient) -> str:
    """The token the live Reasonix binding was given (its MCP server entry)."""
    leases = gw(client).mcp.leases
    [lease] = [lease for lease in leases.leases() if lease.key[0] == "binding"]
    return lease.token


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_reasonix_calls_a_gateway_tool_over_mcp(
    reasonix_gateway: TestClient, fake_llm: FakeOpenAI, transport: str
) -> None:
    client = reasonix_gateway
    runtime = gw(client).runtimes["reasonix"]
    assert isinstance(runtime, AcpRuntime)
    if transport == "stdio":
        # Pretend Reasonix had not declared mcpCapabilities.http: the stdio bridge is used.
        negotiate = runtime._negotiate_policy

        def without_http(result: dict[str, Any], plugins: Any) -> None:
            negotiate(result, plugins)
            runtime.policy.mcp_http = False

        runtime._negotiate_policy = without_http  # type: ignore[method-assign]
    Model(fake_llm)
    session_id = "s-" + uuid.uuid4().hex[:8]

    run_id, events = await run_turn(client, session_id, "Please read the widget note.")
    kinds = [e["kind"] for e in events]
    assert kinds[-1] == "run.completed", events[-3:]
    assert runtime.policy.mcp_http is (transport == "http")

    # The facade's own events (source "tool"), between the agent's tool_call / tool_call_update
    # (mapped to tool.* with source "reasonix").
    tool_events = [e for e in events if e["kind"].startswith("tool.") and e["source"] == "tool"]
    assert [e["kind"] for e in tool_events] == ["tool.started", "tool.completed"], kinds
    agent_events = [e for e in events if e["kind"].startswith("tool.") and e["source"] == "reasonix"]
    assert agent_events[0]["payload"]["rawInput"]["capability_id"] == "mcp-tool:gateway/workspace.read_file"
    assert agent_events[-1]["payload"]["status"] == "completed"
    assert events.index(agent_events[0]) < events.index(tool_events[0]) < events.index(agent_events[-1])
    started, completed = (e["payload"] for e in tool_events)
    assert started["tool"] == "workspace.read_file" and started["caller"] == "mcp"
    assert started["arguments"] == {"path": NOTE}
    assert completed["status"] == "completed" and completed["path"] == NOTE

    response = await client.get(f"/v1/runs/{run_id}/receipts")
    receipts = (await response.json())["receipts"]
    # The facade's receipt, then Reasonix's own report of its `use_capability` call.
    assert [r["source"] for r in receipts] == ["gateway", "agent"], receipts
    receipt, reported = receipts
    assert receipt["receiptId"] == completed["receiptId"]
    assert (receipt["tool"], receipt["allowed"], receipt["caller"]) == ("workspace.read_file", True, "mcp")
    assert (receipt["actorId"], receipt["workspaceId"], receipt["path"]) == ("local", "ws", NOTE)
    run = await (await client.get(f"/v1/runs/{run_id}")).json()
    assert receipt["agentSessionId"] == run["providerRunId"]
    assert (reported["agentId"], reported["status"], reported["toolCallId"]) == (
        "reasonix",
        "completed",
        agent_events[0]["payload"]["toolCallId"],
    )
    assert "mcp-tool:gateway/workspace.read_file" in reported["inputSummary"]
    assert reported["agentSessionId"] == run["providerRunId"]

    # The tool's result reached the model, as the tool message of the last LLM request.
    last = [r for r in fake_llm.requests if r.get("stream")][-1]
    assert last["messages"][-1]["role"] == "tool"
    assert NOTE_TEXT.strip() in message_text(last["messages"][-1]["content"])
    final = [e["payload"]["text"] for e in events if e["kind"] == "message.completed"]
    assert final == ["The note says the widget ships on Friday."]

    # Between runs the binding's lease is refused ...
    token = lease_token(client)
    between = await client.post(
        MCP_PATH,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert between.status == 401
    assert (await between.json())["error"] == {"code": -32001, "message": "no active run for this token"}

    # ... and the binding's next run (same live agent session) is served through the same lease.
    run_id2, events2 = await run_turn(client, session_id, "Now read the widget note again.")
    assert events2[-1]["kind"] == "run.completed"
    mode = next(e for e in events2 if e["kind"] == "session.info.updated")["payload"]["sessionMode"]
    assert mode == "native_live"
    receipts2 = (await (await client.get(f"/v1/runs/{run_id2}/receipts")).json())["receipts"]
    assert [(r["source"], r.get("tool"), r.get("allowed")) for r in receipts2][:1] == [
        ("gateway", "workspace.read_file", True)
    ]
    assert lease_token(client) == token
    assert json.dumps(receipts2[0]).count(run_id2) == 1  # attributed to the second run, not the first
