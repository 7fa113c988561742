"""Helpers for the AG-UI tests: the official JS client's checks, frame parsing, a scripted and a
fake ACP runtime, and run inputs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import Event as AgUiEvent
from aiohttp.test_utils import TestClient
from pydantic import TypeAdapter

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime, AcpSessionStrategy
from agent_gateway.hookspecs import hookimpl
from agent_gateway.runtime import RuntimePolicy, Turn, TurnOutcome
from tests._harness import FAKE_ACP_AGENT, require_mark

EVENT = TypeAdapter(AgUiEvent)
WAIT = 60.0
GUARD = {"X-Agent-Gateway-Client": "tests"}
SCRIPTED = "agui-script"


# -- the official JS client -----------------------------------------------------------------------


def client_dir() -> Path:
    """Where `contrib/peers/install.sh` put @ag-ui/client (AGW_AG_UI_CLIENT_DIR)."""
    require_mark("peers", "the official @ag-ui/client")
    peers = Path(os.environ.get("AGENT_GATEWAY_PEERS_DIR") or Path.home() / ".cache" / "agent-gateway" / "peers")
    path = Path(os.environ.get("AGW_AG_UI_CLIENT_DIR") or peers / "ag-ui-client")
    if not (path / "node_modules" / "@ag-ui" / "client" / "package.json").is_file():
        pytest.fail(
            f"@ag-ui/client is not installed at {path} (AGW_AG_UI_CLIENT_DIR unset or wrong). Install it with "
            "`bash contrib/peers/install.sh ag-ui-client` (contrib/dev/test-all.sh does and exports it).",
            pytrace=False,
        )
    return path


# verify: stdin is a JSON list of event lists; prints one JSON line per list ("ok" or the error).
# run: runs an HttpAgent against argv[3] with RunAgentInput fields from stdin; prints one JSON
# object: the events its subscriber saw, the agent's messages and state, and the error if any.
# resume: the same with an HttpAgent whose request is a GET with `Last-Event-ID: data.lastEventId`.
JS = r"""
const { HttpAgent, verifyEvents } = require("@ag-ui/client");
const { from, lastValueFrom, toArray } = require("rxjs");
const mode = process.argv[2];
let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", async () => {
  const data = JSON.parse(input);
  if (mode === "verify") {
    for (const events of data) {
      try {
        await lastValueFrom(from(events).pipe(verifyEvents(false), toArray()));
        console.log(JSON.stringify("ok"));
      } catch (e) {
        console.log(JSON.stringify(String(e && e.message || e)));
      }
    }
    return;
  }
  // resume: the same agent, whose request is the resume route's GET with Last-Event-ID
  class ResumingAgent extends HttpAgent {
    requestInit() {
      const headers = { ...this.headers, Accept: "text/event-stream", "Last-Event-ID": data.lastEventId };
      return { method: "GET", headers, signal: this.abortController.signal };
    }
  }
  const Agent = mode === "resume" ? ResumingAgent : HttpAgent;
  const agent = new Agent({ url: process.argv[3], headers: data.headers, threadId: data.threadId });
  agent.messages = data.messages;
  const seen = [];
  let error = null;
  try {
    await agent.runAgent({ runId: data.runId, forwardedProps: data.forwardedProps }, {
      onEvent: ({ event }) => { seen.push(event.type); },
      onCustomEvent: ({ event }) => { seen.push("CUSTOM:" + event.name); },
    });
  } catch (e) {
    error = String(e && e.message || e);
  }
  console.log(JSON.stringify({ seen, messages: agent.messages, state: agent.state, error }));
});
"""


async def node(tmp_path: Path, *args: str, stdin: Any) -> str:
    script = tmp_path / "agui.cjs"
    script.write_text(JS)
    env = {**os.environ, "NODE_PATH": str(client_dir() / "node_modules"), "SUPPRESS_TRANSFORMATION_WARNINGS": "1"}
    process = await asyncio.create_subprocess_exec(
        "node",
        str(script),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(WAIT):
            out, err = await process.communicate(json.dumps(stdin).encode())
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


async def js_verify(tmp_path: Path, sequences: list[list[dict[str, Any]]]) -> list[str]:
    out = await node(tmp_path, "verify", stdin=sequences)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# -- frames and the rules -------------------------------------------------------------------------


def parse(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(id, event) of every data frame of an AG-UI SSE body; every frame must carry an id."""
    frames = []
    for block in body.decode().split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        fields = dict(line.split(": ", 1) for line in lines)
        assert set(fields) == {"id", "data"}, block
        frames.append((fields["id"], json.loads(fields["data"])))
    return frames


def check(events: list[dict[str, Any]]) -> None:
    """Every event validates against the ag_ui models, and the AG-UI ordering rules hold: the
    first is RUN_STARTED, content only inside its start/end pair, everything closed before
    RUN_FINISHED, exactly one terminal and it is last."""
    for event in events:
        EVENT.validate_python(event)
    assert events and events[0]["type"] == "RUN_STARTED", events[:1]
    open_items: set[tuple[str, str]] = set()
    pairs = {
        "TEXT_MESSAGE_START": ("text", "messageId", True),
        "TEXT_MESSAGE_END": ("text", "messageId", False),
        "REASONING_START": ("reasoning", "messageId", True),
        "REASONING_END": ("reasoning", "messageId", False),
        "REASONING_MESSAGE_START": ("reasoning_message", "messageId", True),
        "REASONING_MESSAGE_END": ("reasoning_message", "messageId", False),
        "TOOL_CALL_START": ("tool", "toolCallId", True),
        "TOOL_CALL_END": ("tool", "toolCallId", False),
        "STEP_STARTED": ("step", "stepName", True),
        "STEP_FINISHED": ("step", "stepName", False),
    }
    inside = {
        "TEXT_MESSAGE_CONTENT": ("text", "messageId"),
        "REASONING_MESSAGE_CONTENT": ("reasoning_message", "messageId"),
        "TOOL_CALL_ARGS": ("tool", "toolCallId"),
    }
    terminals = [i for i, e in enumerate(events) if e["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert len(terminals) <= 1 and (not terminals or terminals[0] == len(events) - 1), terminals
    for event in events[1:]:
        kind = event["type"]
        assert kind != "RUN_STARTED"
        if kind in pairs:
            group, key, opens = pairs[kind]
            item = (group, event[key])
            assert (item in open_items) != opens, (kind, item)
            (open_items.add if opens else open_items.discard)(item)
        elif kind in inside:
            group, key = inside[kind]
            assert (group, event[key]) in open_items, (kind, event)
        elif kind == "RUN_FINISHED":
            assert not open_items, open_items


# -- the scripted runtime: every kind the mapping knows, in one run ------------------------------

SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("session.info.updated", {"sessionMode": "new_session", "agentSessionId": "as-1"}),
    ("thought.delta", {"text": "thinking "}),
    ("thought.delta", {"text": "hard"}),
    ("plan.updated", {"entries": [{"content": "look", "status": "in_progress"}, {"content": "write"}]}),
    ("message.delta", {"text": "Let me "}),
    ("message.delta", {"text": "look."}),
    ("tool.started", {"toolCallId": "t1", "title": "Read notes.md", "kind": "read", "rawInput": {"path": "n.md"}}),
    ("tool.updated", {"toolCallId": "t1", "status": "in_progress"}),
    ("tool.completed", {"toolCallId": "t1", "status": "completed", "content": [{"content": {"text": "hi"}}]}),
    ("files.changed", {"workspaceId": "local:test", "changes": [{"path": "n.md", "change": "modified"}]}),
    ("permission.requested", {"requestId": "p1", "toolCall": {"toolCallId": "t2"}, "options": []}),
    ("permission.resolved", {"requestId": "p1", "optionId": "allow_once", "by": "host"}),
    ("tool.started", {"toolCallId": "t2", "title": "Write", "rawInput": "{}"}),
    ("plan.updated", {"entries": [{"content": "look", "status": "completed"}, {"content": "write"}]}),
    ("usage.updated", {"used": 3}),
    ("message.delta", {"text": "Done"}),
    ("thought.delta", {"text": "and after"}),
    ("message.completed", {"text": "Let me look.Done"}),
]


class ScriptedRuntime:
    """Emits SCRIPT, then the outcome named by the run's `options.outcome` (default completed);
    `options.hold` keeps the run open until the test sets `self.release`."""

    agent_id = SCRIPTED
    display_name = "AG-UI script (tests)"
    provider = "tests"

    def __init__(self) -> None:
        self.policy = RuntimePolicy(context_carrier="none")
        self.release = asyncio.Event()
        self.turns: list[Turn] = []

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        self.turns.append(turn)
        for kind, payload in SCRIPT:
            await turn.emit(kind, payload)
        if turn.options.get("hold"):
            async with asyncio.timeout(WAIT):
                await self.release.wait()
        status = str(turn.options.get("outcome", "completed"))
        return TurnOutcome(status, None if status == "completed" else f"scripted {status}")

    async def close(self) -> None:
        return None


class ScriptedPlugin:
    def __init__(self) -> None:
        self.runtime = ScriptedRuntime()

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(self.runtime)


class FakeAcpPlugin:
    """The fake ACP agent (a real subprocess) as agents ``fake-basic`` and ``fake-permission``."""

    def __init__(self) -> None:
        self.runtimes = [
            AcpRuntime(
                AcpAgentSpec(
                    f"fake-{behaviour}",
                    f"Fake ACP agent ({behaviour})",
                    "fake-acp",
                    [sys.executable, FAKE_ACP_AGENT, "--behaviour", behaviour],
                )
            )
            for behaviour in ("basic", "permission")
        ]

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        for runtime in self.runtimes:
            register(runtime)

    @hookimpl
    def session_strategy(self, runtime: Any, config: Any) -> Any:
        return AcpSessionStrategy() if runtime in self.runtimes else None


def agui_input(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "threadId": "thread-" + uuid.uuid4().hex[:8],
        "runId": "run-" + uuid.uuid4().hex[:8],
        "messages": [{"id": "u1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {"agentGateway": {"workspaceId": "local:test"}},
        **extra,
    }


async def post_run(client: TestClient, agent: str, body: dict[str, Any]) -> tuple[Any, bytes]:
    async with asyncio.timeout(WAIT):
        response = await client.post(f"/v1/ag-ui/{agent}", json=body)
        return response, await response.read()


async def resume(client: TestClient, host_run_id: str, cursor: str | None, **query: str) -> tuple[Any, bytes]:
    headers = {"Last-Event-ID": cursor} if cursor is not None else {}
    async with asyncio.timeout(WAIT):
        response = await client.get(f"/v1/ag-ui/runs/{host_run_id}/stream", headers=headers, params=query)
        return response, await response.read()
