"""A turn in which an ACP agent calls gateway tools through the gateway's MCP surface (issue #5).

The agent is the fake ACP agent ``python contrib/fake_acp_agents/agent.py --behaviour mcp`` (a real
subprocess, official ``acp`` SDK) run by an :class:`AcpRuntime` behind the real gateway HTTP API.
The gateway gives it its MCP server in ``session/new`` — streamable HTTP (``POST /v1/mcp`` with the
binding's lease token) when the agent is started with ``--mcp-http`` (it then declares
``mcpCapabilities.http``), else the stdio bridge (``python -m agent_gateway.mcp.bridge``) — and the
prompt ``call <tool> <json>`` makes the agent call that tool over MCP and reply with the result.

- with the real LightRAG server and fake LLM of ``tests/test_lightrag.py`` and two indexed workspace
  documents: ``knowledge_rag.query`` through MCP; the run's events carry the facade's
  ``tool.started`` / ``tool.completed`` (source ``tool``, caller ``mcp``) between the agent's own
  tool events, and the agent's message carries the citations (``citationMarkdown``, workspace
  ``sourcePath``); the receipt says caller ``mcp``; no event holds the provider's URL, ``file://``,
  its storage folder or the lease token;
- without LightRAG (fast): ``workspace.read_file`` and ``list`` through MCP, and a refused path.

Both over stdio and HTTP. No sleeps: every wait is a bounded wait for the run to end.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import agent_gateway.testing.fake_openai.server as fake_server
from agent_gateway.app import GATEWAY_KEY
from agent_gateway.config import Config
from agent_gateway.mcp import MCP_PATH, TOKEN_ENV
from agent_gateway.testing.fake_openai import FakeOpenAI
from tests._descriptors import build_app, plugin_host
from tests._harness import MakeGateway, run_to_end
from tests._knowledge_mcp import AGENT, McpAgentPlugin, serve
from tests._lightrag import (
    API_KEY,
    EMBEDDING_DIM,
    OTHER_WIDGET,
    WAIT,
    WIDGET,
    WORKSPACE,
    ZEBRA,
    LightRAG,
    LlmScript,
    Seen,
    bag_of_words,
    index,
    start_lightrag,
)

TRANSPORTS = ("stdio", "http")
QUERY = "Compare the Acme Widget and the striped zebra"
INDEXED = {"notes/widget.md", "research/zebra.md"}
NOTE_TEXT = "MCP note 5c1e: the gadget ships on Tuesday.\n"


# -- the agent ----------------------------------------------------------------------------------------


def body(message: str, session: str) -> dict[str, Any]:
    return {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": AGENT,
        "sessionId": session,
        "workspaceId": WORKSPACE,
        "message": message,
        "context": {"allowedRoots": [""]},
    }


async def turn(client: TestClient, message: str, session: str) -> tuple[str, list[dict[str, Any]]]:
    """One run to its end: (run id, the journal's event dicts)."""
    created, events = await run_to_end(client, body(message, session), timeout=WAIT)
    return created["hostRunId"], [e["data"] for e in events]


def final_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["payload"]["text"] for e in events if e["kind"] == "message.completed")


def tool_events(events: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"].startswith("tool.") and e["source"] == source]


def lease_token(client: TestClient) -> str:
    """The token of the live binding's lease (what its mcpServers entry carries)."""
    leases = client.app[GATEWAY_KEY].mcp.leases.leases()
    [lease] = [lease for lease in leases if isinstance(lease.key, tuple) and lease.key[0] == "binding"]
    return str(lease.token)


def check_transport(plugin: McpAgentPlugin, transport: str, client: TestClient) -> None:
    """The agent was offered the transport asked for, with the binding's lease token."""
    assert plugin.runtime is not None and plugin.runtime.policy.mcp_http is (transport == "http")
    assert len(plugin.entries) == 1, plugin.entries
    entry = plugin.entries[0]
    token = lease_token(client)
    if transport == "http":
        assert entry["type"] == "http" and entry["url"].endswith(MCP_PATH)
        assert entry["headers"] == [{"name": "Authorization", "value": f"Bearer {token}"}]
    else:
        assert "type" not in entry and entry["args"][:2] == ["-m", "agent_gateway.mcp.bridge"]
        assert entry["env"] == [{"name": TOKEN_ENV, "value": token}]


def check_tool_call(events: list[dict[str, Any]], tool: str, arguments: dict[str, Any], status: str) -> None:
    """The agent's tool_call / tool_call_update (source: the agent id) wrap the facade's own tool
    events (source "tool"), which say caller "mcp" and carry a receipt id."""
    agent = tool_events(events, AGENT)
    facade = tool_events(events, "tool")
    assert [e["kind"] for e in agent] == ["tool.started", "tool.completed"], [e["kind"] for e in events]
    assert [e["kind"] for e in facade] == ["tool.started", "tool.completed"], [e["kind"] for e in events]
    assert events.index(agent[0]) < events.index(facade[0]) < events.index(facade[1]) < events.index(agent[1])
    started, completed = agent[0]["payload"], agent[1]["payload"]
    assert started["title"] == tool and started["rawInput"] == arguments and started["status"] == "pending"
    assert completed["status"] == status
    facade_started, facade_completed = facade[0]["payload"], facade[1]["payload"]
    assert facade_started["tool"] == tool and facade_started["caller"] == "mcp"
    assert facade_started["arguments"] == arguments
    assert facade_completed["status"] == status and facade_completed["receiptId"]


# -- knowledge_rag.query through MCP, on the real LightRAG ---------------------------------------------
# The fake LLM, server and workspace of tests/test_lightrag.py (module-scoped here too: one LightRAG
# server for both transports; the documents are indexed once).


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeOpenAI]:
    original = fake_server._embedding
    fake_server._embedding = bag_of_words  # type: ignore[assignment]
    fake = FakeOpenAI(default=LlmScript(), embedding_dim=EMBEDDING_DIM)
    fake.start_in_thread()
    try:
        yield fake
    finally:
        fake.stop_thread()
        fake_server._embedding = original  # type: ignore[assignment]


@pytest.fixture(scope="module")
def rag(llm: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LightRAG]:
    server = start_lightrag(tmp_path_factory.mktemp("lightrag"), llm.base_url)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    for rel, text in (("notes/widget.md", WIDGET), ("research/zebra.md", ZEBRA), ("other/widget.md", OTHER_WIDGET)):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


@pytest.fixture(params=TRANSPORTS)
async def kb_gateway(
    request: pytest.FixtureRequest, rag: LightRAG, workspace: Path, tmp_path: Path
) -> AsyncIterator[tuple[TestClient, McpAgentPlugin, str]]:
    transport = str(request.param)
    plugin = McpAgentPlugin(transport)
    config = Config.load(
        None,
        env={},
        overrides={
            "gateway": {"data_dir": str(tmp_path / "gw")},
            "chat_only": {"base_url": "http://127.0.0.1:9/v1", "model": "m"},
            "workspaces": {"roots": {WORKSPACE: str(workspace)}},
            "lightrag": {"url": rag.url, "api_key": API_KEY, "mode": "mix", "timeout_seconds": 60.0},
        },
    )
    client = await serve(TestClient(TestServer(build_app(config, plugin_host(plugin)))), plugin)
    try:
        yield client, plugin, transport
    finally:
        await client.close()


@pytest.mark.peers
async def test_agent_queries_knowledge_over_mcp_and_events_carry_citations(
    kb_gateway: tuple[TestClient, McpAgentPlugin, str], rag: LightRAG
) -> None:
    client, plugin, transport = kb_gateway
    seen = Seen(rag)
    await index(client, seen, sorted(INDEXED))
    arguments = {"query": QUERY}

    run_id, events = await turn(client, f"call knowledge_rag.query {json.dumps(arguments)}", "s-kb-" + transport)
    seen.add(events)
    assert events[-1]["kind"] == "run.completed", events[-3:]
    check_transport(plugin, transport, client)
    check_tool_call(events, "knowledge_rag.query", arguments, "completed")
    agent_started = tool_events(events, AGENT)[0]["payload"]
    assert agent_started["kind"] == "search"

    # The agent's reply is the tool's JSON as the gateway returned it over MCP: the answer, and
    # references mapped to workspace paths with citations to cite.
    text = final_text(events)
    result = json.loads(text)
    assert result["schema"] == "gateway.knowledge_rag.query_result.v1"
    assert result["answer"].startswith("The Acme Widget is blue")
    refs = {r["sourcePath"]: r for r in result["references"]}
    assert set(refs) == INDEXED, result["references"]
    for path, ref in refs.items():
        assert ref["citationMarkdown"].startswith(f"[{path}") and ref["citationMarkdown"] in text
        assert ref["citationUrl"].startswith("agent-gateway://workspace/local%3Atest/" + path)
    assert result["citations"] == [r["citationMarkdown"] for r in result["references"]]
    # ... streamed in chunks, and given as the agent's tool_call_update content
    assert "".join(e["payload"]["text"] for e in events if e["kind"] == "message.delta") == text
    agent_completed = tool_events(events, AGENT)[-1]["payload"]
    assert agent_completed["content"][0]["content"]["text"] == text

    # The facade's receipt: caller mcp, attributed to this run and the agent's session.
    facade_completed = tool_events(events, "tool")[-1]["payload"]
    response = await client.get(f"/v1/runs/{run_id}/receipts")
    assert response.status == 200, await response.text()
    receipts = seen.add(await response.json())["receipts"]
    # The facade's receipt, then the agent's own report of the call (source agent, no result).
    assert [(r["source"], r.get("kind"), r["status"]) for r in receipts] == [
        ("gateway", None, "completed"),
        ("agent", "search", "completed"),
    ], receipts
    receipt = receipts[0]
    assert receipt["receiptId"] == facade_completed["receiptId"]
    assert (receipt["tool"], receipt["allowed"], receipt["caller"]) == ("knowledge_rag.query", True, "mcp")
    run = await (await client.get(f"/v1/runs/{run_id}")).json()
    assert receipt["agentSessionId"] == run["providerRunId"]

    # No provider URL, file://, storage folder or API key in any event or receipt; nor the token.
    seen.check()
    token = lease_token(client)
    assert all(token not in text for text in seen.texts)


# -- workspace tools only (no LightRAG) -----------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_agent_reads_a_workspace_file_over_mcp(make_gateway: MakeGateway, tmp_path: Path, transport: str) -> None:
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "a.md").write_text(NOTE_TEXT)
    plugin = McpAgentPlugin(transport)
    client = await serve(
        await make_gateway(
            overrides={"workspaces": {"roots": {WORKSPACE: str(ws)}}, "hermes": {"enabled": False}},
            extra_plugins=(plugin,),
        ),
        plugin,
    )
    session = "s-ws-" + transport
    arguments = {"path": "notes/a.md"}

    run_id, events = await turn(client, f"call workspace.read_file {json.dumps(arguments)}", session)
    assert events[-1]["kind"] == "run.completed", events[-3:]
    check_transport(plugin, transport, client)
    check_tool_call(events, "workspace.read_file", arguments, "completed")
    assert tool_events(events, AGENT)[0]["payload"]["kind"] == "fetch"
    result = json.loads(final_text(events))
    assert (result["path"], result["text"]) == ("notes/a.md", NOTE_TEXT)
    receipts = (await (await client.get(f"/v1/runs/{run_id}/receipts")).json())["receipts"]
    gateway_receipts = [r for r in receipts if r["source"] == "gateway"]
    assert [(r["tool"], r["allowed"], r["caller"], r["path"]) for r in gateway_receipts] == [
        ("workspace.read_file", True, "mcp", "notes/a.md")
    ]
    [reported] = [r for r in receipts if r["source"] == "agent"]  # the agent's own tool_call
    assert (reported["title"], reported["kind"], reported["status"]) == ("workspace.read_file", "fetch", "completed")
    assert reported["inputSummary"] == json.dumps(arguments, separators=(",", ":"))

    # The same live binding (and lease) serves the next turns: the tool list, then a refused path,
    # which is a tool result with isError (the agent's tool call fails), not a JSON-RPC error.
    _, listed = await turn(client, "list", session)
    assert listed[-1]["kind"] == "run.completed"
    names = final_text(listed).splitlines()
    assert {"workspace.read_file", "workspace.describe_roots"} <= set(names), names
    refused_id, refused = await turn(client, 'call workspace.read_file {"path": "../outside.md"}', session)
    assert refused[-1]["kind"] == "run.completed"
    check_tool_call(refused, "workspace.read_file", {"path": "../outside.md"}, "failed")
    assert final_text(refused).startswith("path_")
    receipts = (await (await client.get(f"/v1/runs/{refused_id}/receipts")).json())["receipts"]
    assert [(r["source"], r["status"]) for r in receipts] == [("gateway", "denied"), ("agent", "failed")]
    assert [(r["tool"], r["allowed"], r["caller"]) for r in receipts[:1]] == [("workspace.read_file", False, "mcp")]
    assert len(plugin.entries) == 1  # one session/new: one mcpServers entry for all three turns
    token = lease_token(client)
    assert all(token not in json.dumps(e) for e in events + listed + refused)
