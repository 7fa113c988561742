"""A file written through a gateway tool is reported on the run that wrote it, and only there.

The writer is the fake ACP agent (``contrib/fake_acp_agents/agent.py --behaviour mcp --mcp-http``,
a real subprocess behind an :class:`AcpRuntime`) calling ``workspace.write_file`` through the
gateway's MCP surface and ending its turn right after the call — the case where the watcher's
400 ms batch used to arrive after the run had ended and land on whichever run was active then,
with the writer's receipt id. Checked over the real HTTP API:

- the writing run's own stream carries ``files.changed`` (cause ``tool``, its receipt id, the
  before/after versions) right after the facade's ``tool.completed`` and before its terminal event;
- another session's run, active on the same workspace the whole time, and a run started right
  after the writer ended, get no event for that write and none carrying the writer's receipt;
- the workspace stream has the write once, with its receipt;
- a plain file write during a run (no tool: what an agent's own file I/O looks like) is still
  reported by the watcher to the runs active then, with cause ``external``.

No sleeps: the runs are awaited to their end, and the watcher's reports are awaited through a later
"sentinel" write (a batch is handled after every earlier one).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime, AcpSessionStrategy
from agent_gateway.hookspecs import hookimpl
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import FAKE_ACP_AGENT, WAIT, MakeGateway, gateway_of, run_to_end
from tests._watcher import Stream, changed, write

REPO_ROOT = Path(__file__).resolve().parent.parent
WS = "local:ws"
AGENT = "fake-mcp"
TEXT = "written by the agent through the gateway\n"


class WriterPlugin:
    """The fake ACP agent in its ``mcp`` behaviour, offered the gateway's MCP server over HTTP."""

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "mcp", "--mcp-http"]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        self.runtime = AcpRuntime(AcpAgentSpec(AGENT, "Fake MCP agent", "fake-acp", command, env=env))
        register(self.runtime)

    @hookimpl
    def session_strategy(self, runtime: Any, config: Any) -> Any:
        return AcpSessionStrategy() if runtime is getattr(self, "runtime", None) else None


def body(agent_id: str, message: str) -> dict[str, Any]:
    return {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": agent_id,
        "sessionId": "s-" + uuid.uuid4().hex[:10],
        "workspaceId": WS,
        "message": message,
        "context": {"allowedRoots": ["notes/"]},
    }


def receipts_in(events: list[dict[str, Any]]) -> set[str]:
    """Every receipt id any files.changed event of a stream names."""
    return {
        str(c["receiptId"])
        for e in events
        if e["event"] == "files.changed"
        for c in e["data"]["payload"]["changes"]
        if "receiptId" in c
    }


async def test_a_tool_write_lands_on_its_run_before_it_ends_and_on_no_other_run(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "notes").mkdir(parents=True)
    client = await make_gateway(
        overrides={"workspaces": {"roots": {WS: str(workspace)}}, "hermes": {"enabled": False}},
        extra_plugins=(WriterPlugin(),),
    )
    gateway = gateway_of(client)
    gateway.set_public_url(str(client.make_url("")))  # what the agent's MCP client calls

    # Another session's run, active on the same workspace throughout (its model call hangs).
    fake_llm.add(Reply(text="thinking", hang=True))
    other = await (await client.post("/v1/runs", json=body("chat-only", "keep going"))).json()
    other_id = str(other["hostRunId"])
    await gateway.watcher.ready(WS, other_id, timeout=WAIT)

    async with (
        Stream(client, f"/v1/runs/{other_id}/stream") as other_stream,
        Stream(client, f"/v1/workspaces/{WS}/events") as ws_stream,
    ):
        arguments = {"path": "notes/made.md", "text": TEXT}
        created, events = await run_to_end(
            client, body(AGENT, f"call workspace.write_file {json.dumps(arguments)}"), timeout=WAIT
        )
        writer_id = str(created["hostRunId"])
        kinds = [(e["event"], e["data"]["source"]) for e in events]
        assert events[-1]["event"] == "run.completed", kinds

        # The write is on the writer's own stream, right after the facade's tool.completed and
        # before the terminal event, with the receipt that call got.
        [tool_done] = [e for e in events if e["event"] == "tool.completed" and e["data"]["source"] == "tool"]
        receipt_id = tool_done["data"]["payload"]["receiptId"]
        [reported] = [e for e in events if e["event"] == "files.changed"]
        assert events.index(reported) == events.index(tool_done) + 1, kinds
        [change] = reported["data"]["payload"]["changes"]
        assert {k: change[k] for k in ("path", "change", "cause", "receiptId")} == {
            "path": "notes/made.md",
            "change": "added",
            "cause": "tool",
            "receiptId": receipt_id,
        }
        assert change["afterVersion"]["sha256"] == hashlib.sha256(TEXT.encode()).hexdigest()
        assert reported["data"]["payload"]["workspaceId"] == WS
        receipts = (await (await client.get(f"/v1/runs/{writer_id}/receipts")).json())["receipts"]
        # The facade's receipt, then the agent's own report of that call (its tool_call).
        assert [(r["source"], r.get("title")) for r in receipts] == [
            ("gateway", None),
            ("agent", "workspace.write_file"),
        ]
        assert [(r["receiptId"], r["tool"], r["path"]) for r in receipts[:1]] == [
            (receipt_id, "workspace.write_file", "notes/made.md")
        ]

        # A run that starts right after the writer ended: the write's inotify echo may still be
        # on its way, and must not be taken for this run's (or anyone's) change.
        fake_llm.add(Reply(text="thinking", hang=True))
        later = await (await client.post("/v1/runs", json=body("chat-only", "next"))).json()
        later_id = str(later["hostRunId"])
        await gateway.watcher.ready(WS, later_id, timeout=WAIT)

        async with Stream(client, f"/v1/runs/{later_id}/stream") as later_stream:
            # A plain file write (no tool) while both runs are active: the watcher reports it to
            # both, cause external. It is also the sentinel: its batch comes after the echo's.
            await write(workspace / "notes" / "native.md", "no tool wrote this\n")
            for stream in (other_stream, later_stream, ws_stream):
                event = await stream.until(changed("notes/native.md"))
                native = next(c for c in event["data"]["payload"]["changes"] if c["path"] == "notes/native.md")
                assert native == {"path": "notes/native.md", "change": "added", "cause": "external"}
                assert event["data"]["source"] == "watcher"

            for stream in (other_stream, later_stream):
                assert receipt_id not in receipts_in(stream.events), stream.changes()
                assert "notes/made.md" not in [c["path"] for c in stream.changes()], stream.changes()
        # The workspace stream has the write once, with the writer's receipt.
        made = [c for c in ws_stream.changes() if c["path"] == "notes/made.md"]
        assert [(c["cause"], c["receiptId"]) for c in made] == [("tool", receipt_id)], ws_stream.changes()

    for run_id in (other_id, later_id):
        await client.post(f"/v1/runs/{run_id}/cancel", json={})
