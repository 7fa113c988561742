"""A client that falls behind an ACP agent gets merged deltas, as with every other runtime.

The bus merges consecutive `message.delta` / `thought.delta` events whose payloads differ only in
`text` when a client's buffer is full (DESIGN §3: deltas may be merged, same final text); ACP
chunks are mapped to that shape (`{"text": ...}`, see gateway/acp/mapping.py), so a lagging client
of an ACP agent is not sent back to journal replay.

The run is a real gateway with the fake ACP agent `flood` (a real subprocess speaking ACP through
the official SDK), streamed to a raw-socket client with a tiny receive buffer that stops reading.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.hookspecs import hookimpl
from agent_gateway.models import MERGEABLE_KINDS, TERMINAL_KINDS, Event
from tests._harness import (
    FAKE_ACP_AGENT,
    WAIT,
    MakeGateway,
    RawSseClient,
    check_delivery,
    events_page,
    gateway_of,
    metric,
    parse_prometheus,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
AGENT = "flood-acp"
CAPACITY = 64  # the stream buffer (`stream_buffer_events`)
# More frames than the socket buffers of a client that stopped reading can hold (the gateway side
# autotunes up to tcp_wmem, 4 MiB: about 17,000 frames here; the lag began at about 9,300).
CHUNKS = 30_000


class FloodPlugin:
    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "flood"]
        # One journal event per update (no backlog coalescing): what this test is about is the
        # stream merging for a lagging client, which needs more events than its socket holds.
        spec = AcpAgentSpec(AGENT, "Fake ACP (flood)", "fake-acp", command, env=env, coalesce_backlog=0)
        register(AcpRuntime(spec))


async def _metrics(client: TestClient) -> dict[str, Any]:
    response = await client.get("/metrics")
    assert response.status == 200
    return parse_prometheus(await response.text())


async def test_a_client_lagging_behind_an_acp_flood_gets_merged_deltas_and_no_replay(
    make_gateway: MakeGateway,
) -> None:
    client = await make_gateway(
        # Unconfined: the test stops the agent process itself (SIGSTOP), which a sandbox would
        # put out of reach behind bubblewrap and its supervisor.
        overrides={"gateway": {"stream_buffer_events": CAPACITY}, "sandbox": {"mode": "off"}},
        extra_plugins=(FloodPlugin(),),
    )
    gw = gateway_of(client)
    before = await _metrics(client)
    body = {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": AGENT,
        "sessionId": "s-lag",
        "message": f"flood {CHUNKS} numbered",  # the chunks "0,", "1,", ...: order and loss show in the text
    }
    response = await client.post("/v1/runs", json=body)
    assert response.status == 201, await response.text()
    run_id = str((await response.json())["hostRunId"])

    # Right after the publish that makes the lagging client's buffer merge (or, as before ACP
    # chunks were mergeable, send it to replay), stop the agent: the flood cannot end while the
    # client is behind, so its lag stays within what merging absorbs.
    fell_behind = asyncio.Event()
    stopped: list[int] = []

    def watch(event: Event) -> None:
        if fell_behind.is_set():
            return
        subscribers = gw.bus._subscribers.get(run_id, ())
        if any(sub.merges or sub.needs_replay for sub in subscribers):
            binding = next(b for b in gw.runtimes[AGENT]._bindings.values() if b.key.session_id == "s-lag")
            assert binding.process.pid is not None
            os.kill(binding.process.pid, signal.SIGSTOP)
            stopped.append(binding.process.pid)
            fell_behind.set()

    gw.journal.on_append.append(watch)
    slow = RawSseClient(client.server.host, client.server.port, f"/v1/runs/{run_id}/stream")
    await slow.connect()
    try:
        await slow.read_until(lambda e: e["event"] == "message.delta")  # the flood has begun; now stop reading
        async with asyncio.timeout(WAIT):
            await fell_behind.wait()
        subscriber = next(iter(gw.bus._subscribers[run_id]))
        assert not subscriber.needs_replay, "a lagging client of an ACP agent was sent to replay instead of merging"
        assert subscriber.merges > 0
        # The client reads again, with a larger window, and catches up with everything journalled
        # (the stopped agent adds nothing but what was already in its pipe); then it keeps pace
        # with the rest of the flood, so the run's last events find room in its buffer.
        transport_socket = slow._writer.get_extra_info("socket") if slow._writer is not None else None
        assert transport_socket is not None
        transport_socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        for _ in range(10):
            last = await gw.journal.last_event(run_id)
            assert last is not None
            await slow.read_until(lambda e, seq=last.seq: int(e["id"]) >= seq)
            latest = await gw.journal.last_event(run_id)
            if latest is not None and latest.seq == last.seq:
                break
        os.kill(stopped[0], signal.SIGCONT)
        stopped.clear()
        await slow.read_to_end(timeout=WAIT * 2)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        slow.close()
    async with asyncio.timeout(WAIT):
        await gw.runs.wait(run_id)
    after = await _metrics(client)

    journal = await events_page(client, run_id, limit=5000)
    assert journal[-1]["kind"] == "run.completed"
    expected_text = "".join(f"{i}," for i in range(CHUNKS))
    # The journal keeps every chunk as its own event; the lagging client got some merged.
    assert [e["payload"]["text"] for e in journal if e["kind"] == "message.delta"] == [f"{i}," for i in range(CHUNKS)]
    received = slow.events
    check_delivery(received, journal)
    deltas = [e["data"]["payload"] for e in received if e["event"] == "message.delta"]
    assert "".join(d["text"] for d in deltas) == expected_text
    assert any(d.get("mergedCount", 1) > 1 for d in deltas)
    assert len(deltas) < CHUNKS
    completed = [e["data"]["payload"]["text"] for e in received if e["event"] == "message.completed"]
    assert completed == [expected_text]
    non_delta = [int(e["id"]) for e in received if e["event"] not in MERGEABLE_KINDS]
    assert non_delta == [int(e["seq"]) for e in journal if e["kind"] not in MERGEABLE_KINDS]
    assert sum(e["event"] in TERMINAL_KINDS for e in received) == 1
    # What an operator sees: merges, and no journal replay for this client.
    merges = "agent_gateway_stream_merges_total"
    replays = "agent_gateway_stream_replays_total"
    assert metric(after, merges) > metric(before, merges)
    assert metric(after, replays) == metric(before, replays)
