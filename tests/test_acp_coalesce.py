"""An ACP agent that gets ahead of the gateway has its backlog of text chunks journalled joined.

When one read of the agent's stdout brings `coalesce_backlog` updates or more (they waited in the
pipe), consecutive `message.delta` / `thought.delta` payloads that differ only in `text` become one
event: the same text in the same order, every other update still its own event, back-pressure as
before. An agent the gateway keeps up with gets one event per update.

The agent is a raw stdio JSON-RPC writer (a script written by the test, not the SDK): it writes a
turn's updates either in one `write` (a backlog) or one at a time, paced (an agent the gateway
keeps up with).
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from agent_gateway.acp import client as acp_client
from agent_gateway.acp.mapping import coalesce_updates
from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.hookspecs import hookimpl
from tests._harness import MakeGateway, check_delivery, delta_text_of, events_page, gateway_of, run_to_end

AGENT = "raw-acp"

# "backlog N" writes N rounds of three message chunks, one thought chunk and (every 100th round) a
# tool call, all in one write; "paced N" writes N message chunks one at a time, 5 ms apart.
RAW_AGENT = r"""
import json, os, sys, time

def line(message):
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()

def update(session_id, body):
    return line({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": body}})

def chunk(session_id, kind, text):
    return update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": text}})

def write(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]

for raw in sys.stdin.buffer:
    message = json.loads(raw)
    if "id" not in message:
        continue
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        result = {"protocolVersion": 1, "agentCapabilities": {"loadSession": False}}
    elif method == "session/new":
        result = {"sessionId": "raw-1"}
    elif method == "session/prompt":
        mode, count = params["prompt"][0]["text"].split()
        session_id = params["sessionId"]
        if mode == "backlog":
            parts = []
            for i in range(int(count)):
                parts += [chunk(session_id, "agent_message_chunk", f"{i}{letter},") for letter in "abc"]
                parts.append(chunk(session_id, "agent_thought_chunk", f"{i};"))
                if i % 100 == 99:
                    tool_call = {"sessionUpdate": "tool_call", "toolCallId": f"t{i}", "title": "x"}
                    parts.append(update(session_id, tool_call))
            write(b"".join(parts))
        else:
            for i in range(int(count)):
                write(chunk(session_id, "agent_message_chunk", f"{i},"))
                time.sleep(0.005)
        result = {"stopReason": "end_turn"}
    else:
        write(line({"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": method}}))
        continue
    write(line({"jsonrpc": "2.0", "id": message["id"], "result": result}))
"""


class RawAgentPlugin:
    def __init__(self, script: Path, **spec: Any) -> None:
        self.script = script
        self.spec = spec

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, str(self.script)]
        register(AcpRuntime(AcpAgentSpec(AGENT, "Raw ACP", "fake-acp", command, **self.spec)))


async def _gateway(make_gateway: MakeGateway, tmp_path: Path, **spec: Any) -> Any:
    script = tmp_path / "raw_agent.py"
    script.write_text(RAW_AGENT)
    return await make_gateway(extra_plugins=(RawAgentPlugin(script, **spec),))


def _body(message: str) -> dict[str, Any]:
    return {
        "requestId": uuid.uuid4().hex,
        "agentId": AGENT,
        "sessionId": "s-" + uuid.uuid4().hex[:8],
        "message": message,
    }


def test_consecutive_text_deltas_of_one_kind_and_equal_fields_are_joined() -> None:
    def chunk(text: str, kind: str = "agent_message_chunk", **extra: Any) -> dict[str, Any]:
        return {"sessionUpdate": kind, "content": {"type": "text", "text": text}, **extra}

    updates = [
        chunk("a"),
        chunk("b"),
        chunk("c", "agent_thought_chunk"),
        chunk("d", "agent_thought_chunk"),
        {"sessionUpdate": "plan", "entries": []},
        chunk("e"),
        chunk("f", messageId="m"),
        chunk("g", messageId="m"),
        chunk("h", messageId="n"),
        chunk("u", "user_message_chunk"),
        chunk("v", "user_message_chunk"),
        "not an object",
        chunk("i"),
    ]
    assert coalesce_updates(updates) == [
        ("message.delta", {"text": "ab"}),
        ("thought.delta", {"text": "cd"}),
        ("plan.updated", {"entries": []}),
        ("message.delta", {"text": "e"}),
        ("message.delta", {"text": "fg", "messageId": "m"}),
        ("message.delta", {"text": "h", "messageId": "n"}),
        ("user.message.delta", {"text": "u"}),  # not a kind the stream merges: kept one by one
        ("user.message.delta", {"text": "v"}),
        ("agent.update", {"raw": "not an object"}),
        ("message.delta", {"text": "i"}),
    ]
    assert coalesce_updates([]) == []


async def test_a_backlog_is_journalled_joined_in_order_with_back_pressure(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    client = await _gateway(make_gateway, tmp_path)
    gw = gateway_of(client)
    # Storage may hold one event in waiting: the appends of a read wait for room (the reader awaits
    # them before its next message), which must keep the order.
    gw.journal.max_pending = 1
    waits: list[int] = []
    emit_waiting = AcpRuntime._emit_waiting

    async def counting(binding: Any, turn: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
        waits.append(len(events))
        await emit_waiting(binding, turn, events)

    gw.runtimes[AGENT]._emit_waiting = counting  # type: ignore[method-assign]
    rounds = 2000  # 8,020 updates (1.4 MB): more than the agent's stdout pipe holds at once
    receipt, received = await run_to_end(client, _body(f"backlog {rounds}"))
    assert received[-1]["event"] == "run.completed"
    journal = await events_page(client, receipt["hostRunId"])
    check_delivery(received, journal)

    message = "".join(f"{i}{letter}," for i in range(rounds) for letter in "abc")
    thought = "".join(f"{i};" for i in range(rounds))
    assert delta_text_of(journal, "message.delta", wire=True) == message
    assert delta_text_of(journal, "thought.delta", wire=True) == thought
    completed = [e["payload"]["text"] for e in journal if e["kind"] == "message.completed"]
    assert completed == [message]
    # Every tool call is its own event, between the deltas the agent sent before and after it.
    tools = [i for i, e in enumerate(journal) if e["kind"] == "tool.started"]
    assert [journal[i]["payload"]["toolCallId"] for i in tools] == [f"t{i}" for i in range(99, rounds, 100)]
    for index in tools:
        round_number = int(journal[index]["payload"]["toolCallId"][1:])
        before = delta_text_of(journal[:index], "thought.delta", wire=True)
        assert before.endswith(f"{round_number};") and f"{round_number + 1};" not in before
    # Joined: fewer delta events than chunks (a message and a thought run alternate, so at most one
    # event per run of each kind), and the reader waited for room at least once.
    deltas = [e for e in journal if e["kind"] in ("message.delta", "thought.delta")]
    assert len(deltas) < 4 * rounds
    assert all(e["source"] == AGENT for e in deltas)
    assert waits, "storage never made the reader wait: the back-pressure path was not taken"


async def test_an_agent_the_gateway_keeps_up_with_gets_one_event_per_update(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    client = await _gateway(make_gateway, tmp_path)
    receipt, _ = await run_to_end(client, _body("paced 40"))
    journal = await events_page(client, receipt["hostRunId"])
    assert [e["payload"]["text"] for e in journal if e["kind"] == "message.delta"] == [f"{i}," for i in range(40)]


async def test_coalescing_can_be_turned_off(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client = await _gateway(make_gateway, tmp_path, coalesce_backlog=0)
    receipt, received = await run_to_end(client, _body("backlog 300"))
    journal = await events_page(client, receipt["hostRunId"])
    check_delivery(received, journal)
    texts = [e["payload"]["text"] for e in journal if e["kind"] == "message.delta"]
    assert texts == [f"{i}{letter}," for i in range(300) for letter in "abc"]


async def test_a_backlog_is_read_in_blocks_that_let_the_loop_turn(
    make_gateway: MakeGateway, tmp_path: Path, monkeypatch: Any
) -> None:
    """An agent far ahead of the gateway, its output piled up in the gateway's read buffer while the
    reader waited (here: held until the whole turn is buffered), is read one block at a time with a
    loop turn in between: other runs and requests are not held for the whole backlog."""
    handled: list[int] = []  # lines handled, in order, with a 0 for each turn of the counter below
    handle_lines = acp_client.AcpProcess._handle_lines
    held = False
    buffered_bytes: list[int] = []

    async def counting(self: Any, lines: list[bytes]) -> None:
        nonlocal held
        if not held and any(b"session/update" in line for line in lines):
            held = True  # the first update: wait until the agent's whole turn is buffered
            buffered = self._proc.stdout._buffer  # asyncio's StreamReader buffer
            for _ in range(1_000_000):  # bounded: the agent writes 2.3 MB at once
                if b'"stopReason"' in bytes(buffered[-200:]):
                    break
                await asyncio.sleep(0)
            buffered_bytes.append(len(buffered))
        handled.append(len(lines))
        await handle_lines(self, lines)

    monkeypatch.setattr(acp_client.AcpProcess, "_handle_lines", counting)
    client = await _gateway(make_gateway, tmp_path)
    finished = asyncio.Event()

    async def count_turns() -> None:
        for _ in range(100_000_000):  # bounded; ends with the run
            if finished.is_set():
                return
            handled.append(0)
            await asyncio.sleep(0)

    counter = asyncio.create_task(count_turns())
    rounds = 6000  # 24,060 updates, about 2.3 MB
    try:
        receipt, received = await run_to_end(client, _body(f"backlog {rounds}"))
    finally:
        finished.set()
        await counter
    assert received[-1]["event"] == "run.completed", received[-1]
    assert buffered_bytes and buffered_bytes[0] > 2_000_000  # the turn waited in the buffer
    journal = await events_page(client, receipt["hostRunId"])
    assert delta_text_of(journal, "message.delta", wire=True) == "".join(
        f"{i}{letter}," for i in range(rounds) for letter in "abc"
    )
    # Lines handled between two turns of the counter: at most what one block holds (the shortest
    # line here is about 100 bytes). Reading block after block without a turn, the buffered
    # backlog went by in one or two.
    between: list[int] = [0]
    for count in handled:
        if count == 0:
            between.append(0)
        else:
            between[-1] += count
    assert sum(between) >= 4 * rounds
    assert max(between) <= acp_client.READ_BLOCK // 90, max(between)
