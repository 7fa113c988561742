"""Receipts for the tool calls an agent runs itself (``source: "agent"``), next to the gateway's.

The agent is the fake ACP agent (``contrib/fake_acp_agents``, ``--behaviour mcp --mcp-http``, a real
subprocess) behind the real gateway HTTP API. Its prompt ``native <json>`` makes it report tool
calls it "ran itself" (``tool_call`` / ``tool_call_update``), and ``then`` a gateway tool call over
MCP. Checked, on SQLite and PostgreSQL: ``GET /v1/runs/{id}/receipts`` lists the agent's read,
execute and unfinished edit (with their locations, as reported) and the facade's receipt of the MCP
call, each with its source, in the order the calls ended; raw output never; another actor gets 404.
Hostile agents: 5,000 tool calls give at most 1,000 receipts and one saying how many were left
out; a 1 MB title, long paths and many locations are cut. Unit level: the ledger with Pi-shaped
events, and the bounded JSON head of raw input.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import jsonschema  # schemathesis's (the test extra's) own dependency
from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.agent_receipts import (
    AGENT_RECEIPTS_PER_RUN,
    INPUT_SUMMARY_CHARS,
    LOCATIONS_KEPT,
    PATH_CHARS,
    TITLE_CHARS,
    AgentToolLedger,
    json_head,
)
from agent_gateway.hookspecs import hookimpl
from agent_gateway.models import Event, Run
from agent_gateway.plugins.pi_lab.mapping import EventMapper
from tests._harness import FAKE_ACP_AGENT, WAIT, MakeGateway, gateway_of, run_to_end

REPO_ROOT = Path(__file__).resolve().parent.parent
AGENT = "fake-native"
WORKSPACE = "local:test"
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}
TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
NOTE_TEXT = "Receipts note 91d2: the gadget ships on Tuesday.\n"
FLOOD_WAIT = 120.0


class NativeAgentPlugin:
    """An AcpRuntime around the fake agent's ``mcp`` behaviour, its MCP server over HTTP."""

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "mcp", "--mcp-http"]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        register(AcpRuntime(AcpAgentSpec(AGENT, "Fake native-tools agent", "fake-acp", command, env=env)))


async def start(make_gateway: MakeGateway, tmp_path: Path, storage: str = "sqlite") -> TestClient:
    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "a.md").write_text(NOTE_TEXT)
    client = await make_gateway(
        overrides={"workspaces": {"roots": {WORKSPACE: str(ws)}}, "hermes": {"enabled": False}},
        storage=storage,
        tokens=TOKENS,
        extra_plugins=(NativeAgentPlugin(),),
    )
    # Where the agent's MCP client calls back (what a served gateway knows from its config).
    gateway_of(client).set_public_url(str(client.make_url("")))
    return client


def native_body(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": AGENT,
        "sessionId": "s-" + uuid.uuid4().hex[:10],
        "workspaceId": WORKSPACE,
        "message": "native " + json.dumps(spec),
        "context": {"allowedRoots": [""]},
    }


async def native_run(
    client: TestClient, spec: dict[str, Any], timeout: float = WAIT
) -> tuple[str, list[dict[str, Any]]]:
    """A run whose prompt is ``native <spec>``, streamed to its end: (run id, the event dicts)."""
    created, events = await run_to_end(client, native_body(spec), headers=ALICE, timeout=timeout)
    assert events[-1]["event"] == "run.completed", events[-3:]
    return created["hostRunId"], [e["data"] for e in events]


async def native_run_unstreamed(client: TestClient, spec: dict[str, Any], timeout: float = WAIT) -> str:
    """A run whose prompt is ``native <spec>``, waited for without streaming (its events may hold
    lines longer than a client reads); its run id."""
    response = await client.post("/v1/runs", json=native_body(spec), headers=ALICE)
    assert response.status == 201, await response.text()
    run_id = str((await response.json())["hostRunId"])
    async with asyncio.timeout(timeout):
        await gateway_of(client).runs.wait(run_id)
    run = await (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()
    assert run["status"] == "completed", run
    return run_id


async def receipts_of(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/runs/{run_id}/receipts", headers=ALICE)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert (body["schema"], body["hostRunId"]) == ("gateway.tool_receipts.v1", run_id)
    return list(body["receipts"])


async def openapi_of(client: TestClient) -> dict[str, Any]:
    response = await client.get("/openapi.json")
    assert response.status == 200
    return dict(await response.json())


async def receipt_validator(client: TestClient) -> jsonschema.Draft202012Validator:
    """What the served document says of a receipt (its references to other components resolved)."""
    components = (await openapi_of(client))["components"]
    return jsonschema.Draft202012Validator({"$ref": "#/components/schemas/ToolReceipt", "components": components})


# -- a run with native tool calls and a gateway tool call ---------------------------------------------


async def test_native_tool_calls_are_receipted_next_to_the_gateways(
    make_gateway: MakeGateway, tmp_path: Path, storage_kind: str
) -> None:
    client = await start(make_gateway, tmp_path, storage_kind)
    spec = {
        "calls": [
            {
                "kind": "read",
                "title": "Read notes/a.md",
                "locations": [{"path": "notes/a.md", "line": 3}],
                "rawInput": {"path": "notes/a.md"},
            },
            {
                "kind": "execute",
                "title": "Run ls",
                "rawInput": {"command": "ls -la /"},
                "updates": [{"status": "in_progress", "title": "Run ls -la /", "locations": [{"path": "/"}]}],
                "final": "failed",
            },
            {
                "kind": "edit",
                "title": "Edit ../../etc/hosts",
                "locations": [{"path": "../../etc/hosts"}],
                "final": None,
            },
        ],
        "then": 'call workspace.read_file {"path": "notes/a.md"}',
    }
    run_id, events = await native_run(client, spec)
    run = await (await client.get(f"/v1/runs/{run_id}", headers=ALICE)).json()
    facade_completed = [e for e in events if e["kind"] == "tool.completed" and e["source"] == "tool"]
    assert len(facade_completed) == 1, [(e["kind"], e["source"]) for e in events]

    receipts = await receipts_of(client, run_id)
    # In the order the calls ended: the read, the failed command, the facade's MCP call, the agent's
    # own report of that call, and the edit the turn ended without finishing.
    assert [(r["source"], r.get("kind"), r["status"]) for r in receipts] == [
        ("agent", "read", "completed"),
        ("agent", "execute", "failed"),
        ("gateway", None, "completed"),
        ("agent", "fetch", "completed"),
        ("agent", "edit", "pending"),
    ]
    read, execute, facade, reported, edit = receipts
    assert read["locations"] == [{"path": "notes/a.md", "line": 3}]
    assert read["title"] == "Read notes/a.md" and read["inputSummary"] == '{"path":"notes/a.md"}'
    assert execute["title"] == "Run ls -la /" and execute["locations"] == [{"path": "/"}]  # its last update
    assert edit["locations"] == [{"path": "../../etc/hosts"}]  # as reported: never resolved on the host
    assert reported["title"] == "workspace.read_file"
    for receipt in (read, execute, reported, edit):
        assert receipt["toolCallId"] and receipt["receiptId"].startswith("rcpt_")
        assert (receipt["agentId"], receipt["hostRunId"], receipt["actorId"], receipt["workspaceId"]) == (
            AGENT,
            run_id,
            "alice",
            WORKSPACE,
        )
        assert receipt["agentSessionId"] == run["providerRunId"]
        assert receipt["startedAt"] <= receipt["createdAt"]
    # The facade's receipt keeps its shape, with its source.
    assert facade["receiptId"] == facade_completed[0]["payload"]["receiptId"]
    assert (facade["tool"], facade["allowed"], facade["caller"], facade["path"]) == (
        "workspace.read_file",
        True,
        "mcp",
        "notes/a.md",
    )
    assert facade["agentId"] == AGENT
    # No raw output (the agent sent "output of <id>" with every final update), no file contents.
    assert "output of" not in json.dumps(receipts)
    assert NOTE_TEXT.strip() not in json.dumps(receipts)

    # Both kinds match what /openapi.json says of a receipt.
    validator = await receipt_validator(client)
    for receipt in receipts:
        validator.validate(receipt)

    # Bob may not see alice's run, nor its receipts.
    response = await client.get(f"/v1/runs/{run_id}/receipts", headers=BOB)
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "run_not_found"


# -- hostile agents -------------------------------------------------------------------------------------


async def test_a_flood_of_tool_calls_gives_bounded_receipts(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client = await start(make_gateway, tmp_path)
    # 5,000 tool_call updates: half the calls completed, half left unfinished (they count too).
    spec = {
        "calls": [
            {"kind": "read", "title": "Read", "locations": [{"path": "a.md"}]},
            {"kind": "execute", "title": "Run", "final": None},
        ],
        "repeat": 2500,
    }
    run_id, events = await native_run(client, spec, timeout=FLOOD_WAIT)
    assert sum(e["kind"] == "tool.started" for e in events) == 5000
    receipts = await receipts_of(client, run_id)
    assert len(receipts) == AGENT_RECEIPTS_PER_RUN + 1
    assert all(r["source"] == "agent" for r in receipts)
    calls, last = receipts[:-1], receipts[-1]
    assert len({r["toolCallId"] for r in calls}) == AGENT_RECEIPTS_PER_RUN
    assert {r["status"] for r in calls} == {"completed", "pending"}
    validator = await receipt_validator(client)
    for receipt in receipts[-2:]:
        validator.validate(receipt)
    assert (last["status"], last["limit"], last["omittedCalls"], last["toolCallId"]) == (
        "truncated",
        AGENT_RECEIPTS_PER_RUN,
        5000 - AGENT_RECEIPTS_PER_RUN,
        None,
    )


async def test_huge_fields_are_cut(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client = await start(make_gateway, tmp_path)
    long_path = "deep/" * 2000 + "file.md"
    spec = {
        "calls": [
            {
                "kind": "teapot",  # not an ACP kind
                "title": "Edit ",
                "locations": [{"path": long_path, "line": 2**40}] + [{"path": f"p{i}", "line": i} for i in range(100)],
                "rawInput": {"text": "x" * 100_000, "nested": [[[[[[[[[["deep"]]]]]]]]]]},
            }
        ],
        "padTitle": 1_000_000,
    }
    run_id = await native_run_unstreamed(client, spec, timeout=FLOOD_WAIT)
    [receipt] = await receipts_of(client, run_id)
    assert receipt["title"].startswith("Edit tttt") and receipt["title"].endswith("…")
    assert len(receipt["title"]) == TITLE_CHARS + 1
    assert receipt["kind"] == "other"
    locations = receipt["locations"]
    assert len(locations) == LOCATIONS_KEPT
    assert locations[0] == {"path": long_path[:PATH_CHARS] + "…"}  # an out-of-range line is left out
    assert locations[1] == {"path": "p0", "line": 0}
    assert len(receipt["inputSummary"]) == INPUT_SUMMARY_CHARS + 1
    assert receipt["inputSummary"].startswith('{"text":"xxx')
    assert len(json.dumps(receipt)) < 5000
    (await receipt_validator(client)).validate(receipt)


# -- unit level -----------------------------------------------------------------------------------------


def _run() -> Run:
    return Run(
        host_run_id="run_pi",
        request_id="r",
        agent_id="pi-lab",
        provider="pi",
        session_id="s",
        actor_id="alice",
        workspace_id="ws",
        provider_run_id="pi-session-1",
    )


def test_pi_tool_executions_become_receipts() -> None:
    """Pi's tool events (plugins/pi_lab/mapping.py) map onto receipts: its tool name, arguments
    and end status; a call Pi never ended is receipted when the turn ends."""
    mapper, ledger = EventMapper(), AgentToolLedger(_run())
    records = [
        {"type": "tool_execution_start", "toolCallId": "t1", "toolName": "bash", "args": {"command": "ls"}},
        {"type": "tool_execution_end", "toolCallId": "t1", "toolName": "bash", "isError": True, "result": "nope"},
        {"type": "tool_execution_start", "toolCallId": "t2", "toolName": "read", "args": {"path": "a.md"}},
    ]
    seq = 0
    finished = []
    for record in records:
        for kind, payload in mapper.map(record):
            seq += 1
            finished.append(ledger.observe(Event("run_pi", seq, kind, "pi-lab", payload)))
    assert finished.count(True) == 1
    ledger.close()
    receipts = list(ledger.pending)
    assert [(r["tool"], r["status"], r["inputSummary"]) for r in receipts] == [
        ("bash", "failed", '{"command":"ls"}'),
        ("read", "in_progress", '{"path":"a.md"}'),
    ]
    assert {(r["source"], r["agentId"], r["agentSessionId"]) for r in receipts} == {("agent", "pi-lab", "pi-session-1")}


def test_the_facades_own_and_replayed_tool_events_make_no_agent_receipt() -> None:
    from agent_gateway.agent_receipts import NOT_AGENT_SOURCES

    assert {"tool", "adapter_replay"} <= NOT_AGENT_SOURCES
    ledger = AgentToolLedger(_run())
    ledger.observe(Event("run_pi", 1, "tool.started", "pi-lab", {"title": "no id", "status": "pending"}))
    assert not ledger.close() and not ledger.pending  # a call without a toolCallId cannot be followed


def test_json_head_is_bounded_whatever_the_input() -> None:
    assert json_head({"a": [1, None, True, "é"]}) == '{"a":[1,null,true,"é"]}'
    deep: Any = "x"
    for _ in range(10_000):
        deep = [deep]
    head = json_head(deep)
    assert len(head) <= INPUT_SUMMARY_CHARS + 1 and head.startswith("[[[[")
    wide = {f"k{i}": "v" * 1000 for i in range(100_000)}
    assert len(json_head(wide)) == INPUT_SUMMARY_CHARS + 1
    assert json_head("\ud800lone").encode("utf-8") == b'"?lone"'  # a lone surrogate: valid UTF-8
