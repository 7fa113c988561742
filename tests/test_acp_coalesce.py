"""An ACP agent that gets ahead of the gateway has its backlog of text chunks journalled joined.

When one read of the agent's stdout brings `coalesce_backlog` updates or more (by default two: the
second waited in the pipe while the gateway handled the first), consecutive `message.delta` /
`thought.delta` payloads that differ only in `text` become one event: the same text in the same
order, every other update (tool calls, plans) still its own event in place, back-pressure as
before. A paced agent (one update, then a pause) gets one event per update.

The agent is a raw stdio JSON-RPC writer (a script written by the test, not the SDK): it writes a
turn's updates in one `write` (a backlog), one `write` per message as fast as it can (as Node
agents do), or gated by the test: a few updates in one `write`, then nothing until the gateway has
handled them (the test opens the gate from the runtime's update handler: no timing involved).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.acp import client as acp_client
from agent_gateway.acp.mapping import coalesce_updates
from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.hookspecs import hookimpl
from tests._harness import MakeGateway, check_delivery, delta_text_of, events_page, gateway_of, run_to_end

AGENT = "raw-acp"

# "backlog N" writes N rounds of three message chunks, one thought chunk and (every 100th round) a
# tool call and a plan, all in one write; "lines N" the same, one write per message; "gated N K"
# writes N times K message chunks in one write, each time waiting for a byte on the FIFO `gate` in
# the folder given as its argument before the next write (and before the prompt's answer).
RAW_AGENT = r"""
import json, os, sys

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
        mode, count = params["prompt"][0]["text"].split()[:2]
        session_id = params["sessionId"]
        if mode in ("backlog", "lines"):
            parts = []
            for i in range(int(count)):
                parts += [chunk(session_id, "agent_message_chunk", f"{i}{letter},") for letter in "abc"]
                parts.append(chunk(session_id, "agent_thought_chunk", f"{i};"))
                if i % 100 == 99:
                    tool_call = {"sessionUpdate": "tool_call", "toolCallId": f"t{i}", "title": "x"}
                    parts.append(update(session_id, tool_call))
                    plan = {"sessionUpdate": "plan", "entries": [{"content": f"p{i}", "status": "pending"}]}
                    parts.append(update(session_id, plan))
            if mode == "backlog":
                write(b"".join(parts))
            else:
                for part in parts:
                    write(part)
        else:
            per = int(params["prompt"][0]["text"].split()[2])
            with open(os.path.join(sys.argv[1], "gate"), "rb", buffering=0) as gate:
                for i in range(int(count)):
                    write(b"".join(chunk(session_id, "agent_message_chunk", f"{i}.{k},") for k in range(per)))
                    if gate.read(1) != b"g":
                        sys.exit("the gate closed")
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
        # The gate's folder as an argument: an absolute path the sandbox lets the agent read.
        command = [sys.executable, str(self.script), str(self.script.parent / "gate-dir")]
        register(AcpRuntime(AcpAgentSpec(AGENT, "Raw ACP", "fake-acp", command, **self.spec)))


async def _gateway(make_gateway: MakeGateway, tmp_path: Path, **spec: Any) -> Any:
    script = tmp_path / "raw_agent.py"
    script.write_text(RAW_AGENT)
    (tmp_path / "gate-dir").mkdir()
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


@pytest.mark.parametrize("writes", ["backlog", "lines"])
async def test_a_backlog_is_journalled_joined_in_order_with_back_pressure(
    make_gateway: MakeGateway, tmp_path: Path, writes: str
) -> None:
    """`backlog`: the turn in one write; `lines`: one write per message, as fast as the agent can
    (how many share a read is up to the machine: the journal must be exact whatever it is)."""
    client = await _gateway(make_gateway, tmp_path)
    gw = gateway_of(client)
    # Storage may hold one event in waiting: the appends of a read wait for room (the reader awaits
    # them before its next message), which must keep the order.
    gw.journal.max_pending = 1
    # Each of those waits is a group commit: with the idle writer's 2 ms gather before each one
    # (thousands of them), the run took 12 s on 2 quiet cores and over the stream's 20 s bound
    # beside a busy machine's other work; without it, 3.4 s.
    gw.journal.commit_gather = 0
    waits: list[int] = []
    emit_waiting = AcpRuntime._emit_waiting

    async def counting(binding: Any, turn: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
        waits.append(len(events))
        await emit_waiting(binding, turn, events)

    gw.runtimes[AGENT]._emit_waiting = counting  # type: ignore[method-assign]
    rounds = 2000  # 8,040 updates (1.4 MB): more than the agent's stdout pipe holds at once
    receipt, received = await run_to_end(client, _body(f"{writes} {rounds}"))
    assert received[-1]["event"] == "run.completed"
    journal = await events_page(client, receipt["hostRunId"])
    check_delivery(received, journal)

    def message_upto(last: int) -> str:
        return "".join(f"{i}{letter}," for i in range(last + 1) for letter in "abc")

    message = message_upto(rounds - 1)
    thought = "".join(f"{i};" for i in range(rounds))
    assert delta_text_of(journal, "message.delta", wire=True) == message
    assert delta_text_of(journal, "thought.delta", wire=True) == thought
    completed = [e["payload"]["text"] for e in journal if e["kind"] == "message.completed"]
    assert completed == [message]
    # Every tool call and plan is its own event, right after the deltas the agent sent before it
    # and before those it sent after it.
    tools = [i for i, e in enumerate(journal) if e["kind"] == "tool.started"]
    assert [journal[i]["payload"]["toolCallId"] for i in tools] == [f"t{i}" for i in range(99, rounds, 100)]
    plans = [i for i, e in enumerate(journal) if e["kind"] == "plan.updated"]
    assert [journal[i]["payload"]["entries"][0]["content"] for i in plans] == [f"p{i}" for i in range(99, rounds, 100)]
    assert plans == [i + 1 for i in tools]
    for index in tools:
        last = int(journal[index]["payload"]["toolCallId"][1:])  # the round the tool call ends
        before = journal[:index]
        assert delta_text_of(before, "message.delta", wire=True) == message_upto(last)
        assert delta_text_of(before, "thought.delta", wire=True) == "".join(f"{i};" for i in range(last + 1))
    deltas = [e for e in journal if e["kind"] in ("message.delta", "thought.delta")]
    assert all(e["source"] == AGENT for e in deltas)
    if writes == "backlog":
        # Joined: fewer delta events than chunks (a message and a thought run alternate, so at most
        # one event per run of each kind), and the reader waited for room at least once.
        assert len(deltas) < 4 * rounds
        assert waits, "storage never made the reader wait: the back-pressure path was not taken"
    else:
        assert len(deltas) <= 4 * rounds


def _gate_updates(client: Any, tmp_path: Path) -> list[int]:
    """Open the agent's gate once the gateway has handled each read of its updates (after the
    runtime's handler has journalled them, or its awaitable has): the agent writes nothing more
    until then. Returns the list of the updates per read, filled as they come."""
    gate_path = tmp_path / "gate-dir" / "gate"
    os.mkfifo(gate_path)
    gate = os.open(gate_path, os.O_RDWR | os.O_NONBLOCK)  # read-write: never blocks, holds the FIFO open
    runtime = gateway_of(client).runtimes[AGENT]
    on_updates = runtime._on_updates
    reads: list[int] = []

    def release() -> None:
        os.write(gate, b"g")

    def gated(binding: Any, updates: list[tuple[str, Any]]) -> Any:
        result = on_updates(binding, updates)
        if binding.turn is None or not updates:
            return result
        reads.append(len(updates))
        if result is None:
            release()
            return None

        async def then_release() -> None:
            await result
            release()

        return then_release()

    runtime._on_updates = gated
    return reads


async def test_a_paced_agent_gets_one_event_per_update(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """One update, then nothing until the gateway has handled it: each read holds one update, and
    each update is its own event, in order."""
    client = await _gateway(make_gateway, tmp_path)
    reads = _gate_updates(client, tmp_path)
    receipt, received = await run_to_end(client, _body("gated 40 1"))
    assert received[-1]["event"] == "run.completed"
    journal = await events_page(client, receipt["hostRunId"])
    assert reads == [1] * 40
    assert [e["payload"]["text"] for e in journal if e["kind"] == "message.delta"] == [f"{i}.0," for i in range(40)]


async def test_two_updates_in_one_read_are_one_event(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """Two chunks in one write (they reach the gateway in one read): the smallest backlog, joined."""
    client = await _gateway(make_gateway, tmp_path)
    reads = _gate_updates(client, tmp_path)
    receipt, received = await run_to_end(client, _body("gated 40 2"))
    assert received[-1]["event"] == "run.completed"
    journal = await events_page(client, receipt["hostRunId"])
    assert reads == [2] * 40
    assert [e["payload"]["text"] for e in journal if e["kind"] == "message.delta"] == [
        f"{i}.0,{i}.1," for i in range(40)
    ]


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
