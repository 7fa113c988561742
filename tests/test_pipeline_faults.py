"""The event pipeline under faults: a stalled or failing database, slow clients, floods.

DESIGN §3: persisting must not block delivery to browsers; a slow client must not grow memory
without bound; terminal, tool, permission, plan and session events are never dropped or coalesced
(deltas may be merged, same final text); seed 001 §7 / §20.2: after 3,000 `thought.delta` the
terminal event still reaches every browser and the event store.

The runs come from the `script` test runtime (tests/_harness.py); the storage is the real peewee
storage behind a wrapper whose `append_events` the test can block (a `threading.Event`) or fail.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.app import Gateway
from agent_gateway.models import MERGEABLE_KINDS, TERMINAL_KINDS, Event, format_cursor
from tests._harness import (
    WAIT,
    BlockingStorage,
    BlockingStoragePlugin,
    MakeGateway,
    RawSseClient,
    ScriptPlugin,
    check_delivery,
    delta_text_of,
    events_page,
    gateway_of,
    metric,
    parse_prometheus,
    read_stream,
    script_body,
    sse_events,
)


async def _post(client: TestClient, body: dict[str, Any]) -> str:
    response = await client.post("/v1/runs", json=body)
    assert response.status == 201, await response.text()
    return str((await response.json())["hostRunId"])


async def _metrics(client: TestClient) -> dict[str, Any]:
    response = await client.get("/metrics")
    assert response.status == 200
    return parse_prometheus(await response.text())


async def _stored(gw: Gateway, storage: BlockingStorage, run_id: str) -> list[dict[str, Any]]:
    events: list[Event] = await asyncio.get_running_loop().run_in_executor(
        gw.executor, storage.inner.read_events, run_id, 0, None
    )
    return [e.to_wire() for e in events]


async def _resume_from_every_cursor(client: TestClient, run_id: str, journal: list[dict[str, Any]]) -> None:
    """A client resuming from any cursor it has seen gets exactly every later event."""

    async def one(index: int) -> None:
        seq = int(journal[index]["seq"])
        # Alternate the cursor forms: padded afterSeq, plain afterSeq, Last-Event-ID.
        if index % 3 == 0:
            got = await read_stream(client, run_id, after=format_cursor(seq))
        elif index % 3 == 1:
            got = await read_stream(client, run_id, after=str(seq))
        else:
            got = await read_stream(client, run_id, last_event_id=format_cursor(seq))
        assert [e["data"] for e in got] == journal[index + 1 :], f"resume after {seq}"

    indexes = list(range(len(journal)))
    for start in range(0, len(indexes), 32):
        await asyncio.gather(*(one(i) for i in indexes[start : start + 32]))


async def _live_client(client: TestClient, run_id: str, ready: asyncio.Event, timeout: float = WAIT) -> list[Any]:
    """Read a whole stream; `ready` is set once the gate's `plan.updated` arrived (it is tailing)."""
    events = []
    async with asyncio.timeout(timeout), client.get(f"/v1/runs/{run_id}/stream") as response:
        assert response.status == 200
        async for event in sse_events(response):
            events.append(event)
            if event["event"] == "plan.updated":
                ready.set()
    return events


async def _wait_thread_event(event: Any) -> None:
    assert await asyncio.get_running_loop().run_in_executor(None, event.wait, WAIT), "timed out"


# -- 1. fan-out and persistence are decoupled -------------------------------------------------------------


async def test_clients_get_every_event_live_while_the_database_is_blocked(make_gateway: MakeGateway) -> None:
    blocking, script = BlockingStoragePlugin(), ScriptPlugin()
    client = await make_gateway(extra_plugins=(blocking, script))
    gw = gateway_of(client)
    storage = blocking.storage
    assert storage is not None
    storage.hold()
    try:
        run_id = await _post(client, script_body("s-blocked", "req-blocked", deltas=240, every=9, chars=20))
        first, second = await asyncio.gather(read_stream(client, run_id), read_stream(client, run_id))
        # Both clients have the whole run, terminal included, and not one event is in the database.
        await _wait_thread_event(storage.blocked)
        assert storage.written == 0
        assert first[-1]["event"] == "run.completed"
        assert [e["data"] for e in first] == [e["data"] for e in second]
        assert [int(e["id"]) for e in first] == list(range(1, len(first) + 1))
        assert gw.journal.pending == len(first)
        # The status a host polls agrees, and the session is free, before the database has anything.
        receipt = await (await client.get(f"/v1/runs/{run_id}")).json()
        assert receipt["status"] == "completed"
        active = await (await client.get("/v1/sessions/s-blocked/active-run")).json()
        assert active["run"] is None
        # The JSON pages and resumed streams serve the uncommitted journal.
        journal = await events_page(client, run_id, limit=50)
        assert journal == [e["data"] for e in first]
        await _resume_from_every_cursor(client, run_id, journal)
        assert storage.written == 0
    finally:
        storage.release()
    async with asyncio.timeout(WAIT):
        await gw.journal.flush()
        await gw.runs.wait(run_id)
    assert await _stored(gw, storage, run_id) == journal
    stored_run = await asyncio.get_running_loop().run_in_executor(gw.executor, storage.inner.get_run, run_id)
    assert stored_run.status == "completed"
    # After the catch-up, resuming reads from the database: still exactly every later event.
    assert gw.journal.pending == 0
    await _resume_from_every_cursor(client, run_id, journal)


async def test_a_failing_database_is_retried_without_blocking_delivery(make_gateway: MakeGateway) -> None:
    blocking, script = BlockingStoragePlugin(), ScriptPlugin()
    client = await make_gateway(extra_plugins=(blocking, script))
    gw = gateway_of(client)
    storage = blocking.storage
    assert storage is not None
    storage.fail_next = 3
    run_id = await _post(client, script_body("s-failing", "req-failing", deltas=120, every=5))
    live = await read_stream(client, run_id)
    assert live[-1]["event"] == "run.completed"
    async with asyncio.timeout(WAIT):
        await gw.journal.flush()
    assert storage.failures == 3
    samples = await _metrics(client)
    assert metric(samples, "agent_gateway_journal_commit_errors_total") == 3
    assert metric(samples, "agent_gateway_journal_pending_events") == 0
    # Every event stored exactly once, equal to what the client saw.
    assert await _stored(gw, storage, run_id) == [e["data"] for e in live]


# -- 2. backpressure: a slow client with a small buffer --------------------------------------------------


CAPACITY = 8


async def test_a_slow_client_gets_everything_in_order_with_bounded_buffers(make_gateway: MakeGateway) -> None:
    script = ScriptPlugin()
    client = await make_gateway(overrides={"gateway": {"stream_buffer_events": CAPACITY}}, extra_plugins=(script,))
    gw = gateway_of(client)
    peaks: list[int] = []
    terminal_peak: list[int] = []

    def sample(event: Event) -> None:  # runs right after each publish: the exact high-water mark
        (terminal_peak if event.is_terminal else peaks).append(gw.bus.buffered())

    gw.journal.on_append.append(sample)
    before = await _metrics(client)
    run_id = await _post(
        client,
        # ~10 MB of frames: more than the kernel's socket buffers take for a reader that stopped
        # (tcp_wmem allows the gateway's side up to 4 MiB), so the gateway's own buffers fill.
        script_body("s-slow", "req-slow", deltas=5000, every=40, chars=2000, yieldEvery=64, gate="go"),
    )
    # A slow client (tiny socket buffer; we stop reading) and a normal one.
    slow = RawSseClient(client.server.host, client.server.port, f"/v1/runs/{run_id}/stream")
    await slow.connect()
    await slow.read_until(lambda e: e["event"] == "plan.updated")  # it is tailing the live bus now
    ready = asyncio.Event()
    fast_task = asyncio.create_task(_live_client(client, run_id, ready, timeout=WAIT * 2))
    async with asyncio.timeout(WAIT):
        await ready.wait()
    script.runtime.gate("go").set()
    try:
        async with asyncio.timeout(WAIT * 2):
            await gw.runs.wait(run_id)
        fast = await fast_task
        # The run is over; the slow client has read nothing since. Its buffer is still bounded.
        during = await _metrics(client)
        assert metric(during, "agent_gateway_stream_buffered_events") <= CAPACITY + 1
        await slow.read_to_end(timeout=WAIT * 2)
    finally:
        slow.close()
    after = await _metrics(client)
    journal = await events_page(client, run_id, limit=5000)
    assert journal[-1]["kind"] == "run.completed"
    clients = 2
    assert max(peaks) <= clients * CAPACITY, max(peaks)
    assert max(terminal_peak) <= clients * (CAPACITY + 1)  # a terminal event is always buffered
    for received in (fast, slow.events):
        check_delivery(received, journal)
        assert delta_text_of(received, "message.delta", wire=False) == delta_text_of(journal, "message.delta", True)
        non_delta = [int(e["id"]) for e in received if e["event"] not in MERGEABLE_KINDS]
        assert non_delta == [int(e["seq"]) for e in journal if e["kind"] not in MERGEABLE_KINDS]
        assert sum(e["event"] in TERMINAL_KINDS for e in received) == 1
    # The slow client fell behind: deltas were merged and a non-mergeable overflow sent it to replay.
    assert metric(after, "agent_gateway_stream_replays_total") > metric(before, "agent_gateway_stream_replays_total")
    assert metric(after, "agent_gateway_stream_merges_total") > 0
    assert metric(after, "agent_gateway_streams_open") == 0
    assert metric(after, "agent_gateway_stream_buffered_events") == 0


async def test_live_tails_get_every_event_over_http_1_1_and_1_0(make_gateway: MakeGateway) -> None:
    """Clients keeping up get published batches written straight to their socket: in HTTP/1.1
    chunks, and as the bare body for an HTTP/1.0 client (no chunked encoding there)."""
    script = ScriptPlugin()
    client = await make_gateway(extra_plugins=(script,))
    run_id = await _post(
        client, script_body("s-versions", "req-versions", deltas=3000, every=100, yieldEvery=100, gate="go")
    )
    tails = []
    for version in ("1.1", "1.0"):
        tail = RawSseClient(client.server.host, client.server.port, f"/v1/runs/{run_id}/stream", http_version=version)
        await tail.connect(rcvbuf=1 << 20)
        await tail.read_until(lambda e: e["event"] == "plan.updated")  # tailing the live bus now
        tails.append(tail)
    assert [tail._chunked for tail in tails] == [True, False]
    before = await _metrics(client)
    script.runtime.gate("go").set()
    try:
        for tail in tails:
            await tail.read_to_end(timeout=WAIT * 2)
    finally:
        for tail in tails:
            tail.close()
    journal = await events_page(client, run_id, limit=5000)
    assert journal[-1]["kind"] == "run.completed"
    for tail in tails:
        check_delivery(tail.events, journal)
        assert len(tail.events) == len(journal)  # nothing merged: both kept up
        # The body is SSE and nothing else (no chunk framing left in it, for either version).
        lines = bytes(tail.body).split(b"\n")
        assert all(line == b"" or line.startswith((b"id: ", b"event: ", b"data: ", b":")) for line in lines), [
            line for line in lines if line and not line.startswith((b"id: ", b"event: ", b"data: ", b":"))
        ][:3]
    after = await _metrics(client)
    assert metric(after, "agent_gateway_stream_merges_total") == metric(before, "agent_gateway_stream_merges_total")


# -- 3. terminal priority (seed 001 §20.2) ---------------------------------------------------------------


@pytest.mark.parametrize("database", ["free", "blocked"])
async def test_terminal_reaches_every_client_after_3000_thought_deltas(
    make_gateway: MakeGateway, database: str
) -> None:
    blocking, script = BlockingStoragePlugin(), ScriptPlugin()
    client = await make_gateway(overrides={"gateway": {"stream_buffer_events": 256}}, extra_plugins=(blocking, script))
    gw = gateway_of(client)
    storage = blocking.storage
    assert storage is not None
    terminal_appended = asyncio.Event()
    gw.journal.on_append.append(lambda e: terminal_appended.set() if e.is_terminal else None)
    if database == "blocked":
        storage.hold()
    slow_clients: list[RawSseClient] = []
    try:
        run_id = await _post(
            client,
            script_body("s-seed", "req-seed", deltas=3000, deltaKind="thought.delta", chars=40, gate="go"),
        )
        for _ in range(3):
            slow = RawSseClient(client.server.host, client.server.port, f"/v1/runs/{run_id}/stream")
            await slow.connect()
            await slow.read_until(lambda e: e["event"] == "plan.updated")
            slow_clients.append(slow)
        opened: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        fast_tasks = [asyncio.create_task(_live_client(client, run_id, ready)) for ready in opened]
        async with asyncio.timeout(WAIT):
            for ready in opened:
                await ready.wait()
        script.runtime.gate("go").set()
        async with asyncio.timeout(WAIT):
            await terminal_appended.wait()
            fast_results = await asyncio.gather(*fast_tasks)
        # Every connected client gets the terminal, last, exactly once — the slow ones too, which
        # only start reading now — even while the database has not stored a single event.
        if database == "blocked":
            assert storage.written == 0
        receipt = await (await client.get(f"/v1/runs/{run_id}")).json()
        assert receipt["status"] == "completed"
        assert (await (await client.get("/v1/sessions/s-seed/active-run")).json())["run"] is None
        slow_results = [await slow.read_to_end() for slow in slow_clients]
        if database == "blocked":
            assert storage.written == 0
    finally:
        storage.release()
        for slow in slow_clients:
            slow.close()
    journal = await events_page(client, run_id, limit=5000)
    for received in [*fast_results, *slow_results]:
        assert received[-1]["event"] == "run.completed"
        assert sum(e["event"] in TERMINAL_KINDS for e in received) == 1
        check_delivery(received, journal)
        assert delta_text_of(received, "thought.delta", wire=False) == delta_text_of(journal, "thought.delta", True)
    async with asyncio.timeout(WAIT):
        await gw.journal.flush()
        await gw.runs.wait(run_id)
    stored = await _stored(gw, storage, run_id)
    assert stored == journal
    assert stored[-1]["kind"] == "run.completed"
    assert sum(e["kind"] == "thought.delta" for e in stored) == 3000
