"""The runs HTTP API against DESIGN §3: receipts, idempotency, paging, SSE resume, terminal rules,
active-run, cancel, the chat-only transcript, actors, input validation and the OpenAPI file.

Every test drives a real gateway (aiohttp TestServer) whose chat-only runtime talks to the fake
OpenAI upstream. No sleep is used to synchronise; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sqlite3
import threading
from typing import Any

import pytest

from agent_gateway.models import TERMINAL_KINDS, TERMINAL_STATUSES, Event, Run
from agent_gateway.routes.console import CONSOLE_ROUTES
from agent_gateway.testing.fake_openai import Reply
from tests._harness import WAIT, events_page, gateway_of, read_stream, run_body, run_to_end, sse_events, stream_path

RECEIPT_KEYS = {
    "schema",
    "hostRunId",
    "requestId",
    "agentId",
    "provider",
    "providerRunId",
    "sessionId",
    "actorId",
    "workspaceId",
    "status",
    "sessionMode",
    "targetSnapshotHash",
    "capabilitySnapshotHash",
    "parentRunId",
    "createdAt",
    "updatedAt",
}
TOKENS = {"tok-alice-0123456789": "alice", "tok-bob-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-0123456789ab"}
CURSOR = re.compile(r"^\d{18}$")


def seq_of(event: dict[str, Any]) -> int:
    return int(event["id"])


def pad(seq: int) -> str:
    return f"{seq:018d}"


async def json_error(response: Any, status: int) -> dict[str, Any]:
    """Assert a JSON error answer with `status`; return its error object."""
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body["error"]) >= {"code", "message"}, body
    return body["error"]


async def create(client: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=body, headers=headers or {})
    assert response.status == 201, await response.text()
    return await response.json()


async def wait_for_kind(
    client: Any, run_id: str, kind: str, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Stream a run until an event of `kind` arrives (bounded); return the events seen so far."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        async with client.get(stream_path(run_id), headers=headers or {}) as response:
            assert response.status == 200
            async for event in sse_events(response):
                seen.append(event)
                if event["event"] == kind:
                    return seen
    raise AssertionError(f"the stream of {run_id} ended without {kind}: {[e['event'] for e in seen]}")


async def get_run(client: Any, run_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{run_id}", headers=headers or {})
    assert response.status == 200, await response.text()
    return await response.json()


async def active_run(client: Any, session_id: str, headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    response = await client.get(f"/v1/sessions/{session_id}/active-run", headers=headers or {})
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["sessionId"] == session_id
    return body["run"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- creation and idempotency -----------------------------------------------------------------------


async def test_create_returns_201_with_a_full_receipt(make_gateway):
    client = await make_gateway()
    body = run_body("hello", context={"target": {"path": "notes/a.md"}})
    response = await client.post("/v1/runs", json=body)
    assert response.status == 201
    receipt = await response.json()
    assert RECEIPT_KEYS <= set(receipt)
    assert receipt["schema"] == "gateway.run.v1"
    assert receipt["hostRunId"].startswith("run_")
    assert response.headers["Location"] == f"/v1/runs/{receipt['hostRunId']}"
    assert receipt["requestId"] == body["requestId"]
    assert receipt["agentId"] == "chat-only"
    assert receipt["sessionId"] == body["sessionId"]
    assert receipt["workspaceId"] == body["workspaceId"]
    assert receipt["actorId"] == "local"
    assert receipt["status"] in {"pending", "queued", "running"}
    assert receipt["targetSnapshotHash"] and receipt["capabilitySnapshotHash"]
    events = await read_stream(client, receipt["hostRunId"])
    assert events[0]["event"] == "run.created"
    assert events[-1]["event"] == "run.completed"
    final = await get_run(client, receipt["hostRunId"])
    assert final["status"] == "completed"
    assert final["createdAt"] <= final["updatedAt"]


async def test_same_request_id_and_body_returns_the_same_run_and_appends_nothing(make_gateway, storage_kind):
    client = await make_gateway(storage=storage_kind)
    body = run_body("idempotent please")
    first = await create(client, body)
    run_id = first["hostRunId"]
    # A retry while the run may still be active.
    retry = await client.post("/v1/runs", json=body)
    assert retry.status == 200
    assert (await retry.json())["hostRunId"] == run_id
    await read_stream(client, run_id)
    before = await events_page(client, run_id)
    # Retries after it ended, some of them concurrent.
    responses = await asyncio.gather(*(client.post("/v1/runs", json=body) for _ in range(5)))
    for response in responses:
        assert response.status == 200
        receipt = await response.json()
        assert receipt["hostRunId"] == run_id
        assert receipt["status"] == "completed"
    assert await events_page(client, run_id) == before
    assert sum(e["kind"] == "run.created" for e in before) == 1


async def test_concurrent_first_posts_create_exactly_one_run(make_gateway, storage_kind, fake_llm):
    client = await make_gateway(storage=storage_kind)
    body = run_body("race")
    responses = await asyncio.gather(*(client.post("/v1/runs", json=body) for _ in range(6)))
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * 5 + [201]
    ids = {(await r.json())["hostRunId"] for r in responses}
    assert len(ids) == 1
    await read_stream(client, ids.pop())
    assert len(fake_llm.requests) == 1


async def test_same_request_id_with_another_body_is_409(make_gateway, storage_kind):
    client = await make_gateway(storage=storage_kind)
    body = run_body("first")
    receipt = await create(client, body)
    other = dict(body, message="second")
    error = await json_error(await client.post("/v1/runs", json=other), 409)
    assert error["code"] == "request_conflict"
    assert error["hostRunId"] == receipt["hostRunId"]
    # Still conflicting after the run ended; the original is untouched.
    await read_stream(client, receipt["hostRunId"])
    await json_error(await client.post("/v1/runs", json=dict(body, options={"model": "x"})), 409)
    assert (await get_run(client, receipt["hostRunId"]))["status"] == "completed"


async def test_same_request_id_from_another_actor_or_session_is_another_run(make_gateway):
    client = await make_gateway(tokens=TOKENS)
    body = run_body("shared key")
    alice = await create(client, body, ALICE)
    bob = await create(client, body, BOB)
    assert alice["hostRunId"] != bob["hostRunId"]
    assert (alice["actorId"], bob["actorId"]) == ("alice", "bob")
    other_session = await create(client, dict(body, sessionId="another-session"), ALICE)
    assert other_session["hostRunId"] not in {alice["hostRunId"], bob["hostRunId"]}
    for run_id, headers in ((alice["hostRunId"], ALICE), (bob["hostRunId"], BOB)):
        events = await read_stream(client, run_id, headers=headers)
        assert events[-1]["event"] == "run.completed"


# -- the JSON events page -----------------------------------------------------------------------------


async def test_events_page_after_seq_limit_and_next_cursor(make_gateway, storage_kind, fake_llm):
    fake_llm.add(Reply(text="abcdefghijklmnopqrstuvwxyz", chunk_size=3))
    client = await make_gateway(storage=storage_kind)
    receipt, streamed = await run_to_end(client, run_body("page me"))
    run_id = receipt["hostRunId"]
    page = await (await client.get(f"/v1/runs/{run_id}/events")).json()
    assert page["hostRunId"] == run_id
    assert page["complete"] is True
    events = page["events"]
    assert [e["seq"] for e in events] == [e["id"] for e in streamed]
    assert [e["kind"] for e in events] == [e["event"] for e in streamed]
    assert all(CURSOR.match(e["seq"]) for e in events)
    seqs = [int(e["seq"]) for e in events]
    assert seqs == sorted(set(seqs)) and seqs[0] == 1
    assert page["nextCursor"] == events[-1]["seq"]
    assert sum(e["kind"] in TERMINAL_KINDS for e in events) == 1 and events[-1]["kind"] == "run.completed"

    middle = seqs[len(seqs) // 2]
    for after in ("0", str(middle), pad(middle)):
        got = (await (await client.get(f"/v1/runs/{run_id}/events", params={"afterSeq": after})).json())["events"]
        assert [int(e["seq"]) for e in got] == [s for s in seqs if s > int(after)]

    # Paging two at a time visits every event exactly once, in order.
    cursor, visited, pages = "0", [], 0
    while True:
        response = await client.get(f"/v1/runs/{run_id}/events", params={"afterSeq": cursor, "limit": "2"})
        chunk = await response.json()
        assert len(chunk["events"]) <= 2
        if not chunk["events"]:
            assert chunk["nextCursor"] == cursor
            break
        pages += 1
        assert chunk["nextCursor"] == chunk["events"][-1]["seq"]
        assert chunk["complete"] is (chunk["events"][-1]["kind"] in TERMINAL_KINDS)
        visited.extend(chunk["events"])
        cursor = chunk["nextCursor"]
    assert visited == events
    assert pages == (len(events) + 1) // 2

    beyond = await (await client.get(f"/v1/runs/{run_id}/events", params={"afterSeq": pad(seqs[-1])})).json()
    assert beyond["events"] == [] and beyond["nextCursor"] == pad(seqs[-1])


async def test_bad_cursor_or_limit_is_a_400_json_error(make_gateway):
    client = await make_gateway()
    receipt, _ = await run_to_end(client, run_body("x"))
    run_id = receipt["hostRunId"]
    for bad in ("abc", "-1", "1" * 19, "1.5", "0x10", "+5"):
        response = await client.get(f"/v1/runs/{run_id}/events", params={"afterSeq": bad})
        error = await json_error(response, 400)
        assert error["code"] == "invalid_cursor"
        await json_error(await client.get(f"/v1/runs/{run_id}/stream", params={"afterSeq": bad}), 400)
        await json_error(await client.get(f"/v1/runs/{run_id}/stream", headers={"Last-Event-ID": bad}), 400)
    for bad in ("0", "99999", "-3", "ten"):
        error = await json_error(await client.get(f"/v1/runs/{run_id}/events", params={"limit": bad}), 400)
        assert error["code"] == "invalid_limit"


# -- SSE --------------------------------------------------------------------------------------------


async def test_stream_ids_are_padded_increasing_and_end_with_one_terminal(make_gateway, fake_llm):
    fake_llm.add(Reply(text="one two three four five", chunk_size=4, reasoning="hmm"))
    client = await make_gateway()
    _, events = await run_to_end(client, run_body("stream"))
    ids = [e["id"] for e in events]
    assert all(CURSOR.match(i) for i in ids)
    assert [int(i) for i in ids] == list(range(1, len(ids) + 1))
    for event in events:
        assert event["data"]["schema"] == "gateway.run_event.v1"
        assert event["data"]["seq"] == event["id"]
        assert event["data"]["kind"] == event["event"]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run.created" and kinds[-1] == "run.completed"
    assert [k for k in kinds if k in TERMINAL_KINDS] == ["run.completed"]
    assert "".join(e["data"]["payload"]["text"] for e in events if e["event"] == "message.delta") == (
        "one two three four five"
    )
    assert "".join(e["data"]["payload"]["text"] for e in events if e["event"] == "thought.delta") == "hmm"


async def test_stream_resume_with_last_event_id_and_after_seq(make_gateway, fake_llm):
    fake_llm.add(Reply(text="0123456789" * 3, chunk_size=2))
    client = await make_gateway()
    receipt, full = await run_to_end(client, run_body("resume"))
    run_id = receipt["hostRunId"]
    middle = seq_of(full[len(full) // 2])
    expected = [e for e in full if seq_of(e) > middle]
    assert await read_stream(client, run_id, last_event_id=pad(middle)) == expected
    assert await read_stream(client, run_id, last_event_id=str(middle)) == expected
    assert await read_stream(client, run_id, after=str(middle)) == expected
    assert await read_stream(client, run_id, after=pad(middle)) == expected
    # A browser reconnect keeps its URL; the Last-Event-ID header wins over the query.
    assert await read_stream(client, run_id, after="0", last_event_id=pad(middle)) == expected


async def test_stream_after_the_end_replays_everything_then_closes(make_gateway):
    client = await make_gateway()
    receipt, full = await run_to_end(client, run_body("late viewer"))
    run_id = receipt["hostRunId"]
    assert await read_stream(client, run_id, timeout=5) == full
    assert await read_stream(client, run_id, after="0", timeout=5) == full
    # Resumed at (or past) the terminal event: closes at once with nothing.
    assert await read_stream(client, run_id, last_event_id=full[-1]["id"], timeout=5) == []
    assert await read_stream(client, run_id, after=pad(seq_of(full[-1]) + 10), timeout=5) == []


async def _resuming_reader(client: Any, run_id: str, breaks: list[int], first_cursor: str | None = None) -> list:
    """Read a run's stream, dropping the connection after each count in `breaks` and reconnecting
    with Last-Event-ID = the last id seen."""
    seen: list[dict[str, Any]] = []
    last = first_cursor
    for stop_after in [*breaks, None]:
        headers = {"Last-Event-ID": last} if last is not None else {}
        count = 0
        async with client.get(stream_path(run_id), headers=headers) as response:
            assert response.status == 200
            async for event in sse_events(response):
                seen.append(event)
                last = event["id"]
                count += 1
                if stop_after is not None and count >= stop_after:
                    break
        if seen and seen[-1]["event"] in TERMINAL_KINDS:
            break
    return seen


async def test_concurrent_resume_while_events_are_appended(make_gateway, fake_llm, storage_kind):
    text = "".join(chr(ord("a") + i % 26) for i in range(200))
    fake_llm.add(Reply(text=text, chunk_size=1, delay=0.004))
    client = await make_gateway(storage=storage_kind)
    receipt = await create(client, run_body("slow stream"))
    run_id = receipt["hostRunId"]
    plans = [[], [1], [5, 7, 30], [40, 1, 1, 60], [3] * 12, [100]]
    async with asyncio.timeout(WAIT * 2):
        # Some readers start at once, others after the first one has seen a few events.
        early = [asyncio.create_task(_resuming_reader(client, run_id, plan)) for plan in plans]
        await wait_for_kind(client, run_id, "message.delta")
        late = [asyncio.create_task(_resuming_reader(client, run_id, plan)) for plan in plans[1:4]]
        late.append(asyncio.create_task(_resuming_reader(client, run_id, [2, 9], first_cursor=pad(3))))
        results = await asyncio.gather(*early, *late)
    journal = await events_page(client, run_id)
    assert journal[-1]["kind"] == "run.completed"
    expected = [(e["seq"], e["kind"], e) for e in journal]
    for seen in results[:-1]:
        assert [(e["id"], e["event"], e["data"]) for e in seen] == expected
    assert [(e["id"], e["event"], e["data"]) for e in results[-1]] == [x for x in expected if int(x[0]) > 3]
    deltas = "".join(e["payload"]["text"] for e in journal if e["kind"] == "message.delta")
    assert deltas == text


# -- terminal rules and repair ---------------------------------------------------------------------


def _stored_run(run_id: str, status: str, session_id: str = "s-stored", actor_id: str = "local") -> Run:
    return Run(
        host_run_id=run_id,
        request_id="req-" + run_id,
        agent_id="chat-only",
        provider="openai-compatible",
        session_id=session_id,
        actor_id=actor_id,
        workspace_id="local:test",
        status=status,
    )


async def test_terminal_status_without_terminal_event_is_repaired_on_read(make_gateway, storage_kind):
    client = await make_gateway(storage=storage_kind)
    storage = gateway_of(client).storage
    run_id = "run_repair_missing_terminal"
    storage.insert_run(_stored_run(run_id, "completed"))
    storage.append_events(
        [
            Event(run_id, 1, "run.created", "gateway", {}),
            Event(run_id, 2, "message.delta", "chat-only", {"text": "hi"}),
        ]
    )
    # Several readers at once must still produce exactly one terminal event.
    responses = await asyncio.gather(*(client.get(f"/v1/runs/{run_id}") for _ in range(6)))
    for response in responses:
        assert response.status == 200
        assert (await response.json())["status"] == "completed"
    stored = storage.read_events(run_id)
    assert [e.kind for e in stored] == ["run.created", "message.delta", "run.completed"]
    assert [e.seq for e in stored] == [1, 2, 3]
    assert storage.get_run(run_id).status == "completed"
    # Reading again appends nothing; the stream replays the repaired journal and closes.
    await get_run(client, run_id)
    assert len(storage.read_events(run_id)) == 3
    events = await read_stream(client, run_id, timeout=5)
    assert [e["event"] for e in events] == ["run.created", "message.delta", "run.completed"]


async def test_terminal_event_with_active_status_repairs_the_status(make_gateway, storage_kind):
    client = await make_gateway(storage=storage_kind)
    storage = gateway_of(client).storage
    run_id = "run_repair_status"
    storage.insert_run(_stored_run(run_id, "running"))
    storage.append_events(
        [
            Event(run_id, 1, "run.created", "gateway", {}),
            Event(run_id, 2, "run.started", "gateway", {}),
            Event(run_id, 3, "run.failed", "gateway", {"status": "failed", "reason": "boom"}),
        ]
    )
    assert (await get_run(client, run_id))["status"] == "failed"
    assert storage.get_run(run_id).status == "failed"
    assert [e.kind for e in storage.read_events(run_id)][-1] == "run.failed"
    assert len(storage.read_events(run_id)) == 3


async def test_active_run_left_by_a_dead_process_is_interrupted_at_start_up(make_gateway, storage_kind, tmp_path):
    first = await make_gateway(storage=storage_kind, data_dir=tmp_path)
    storage = gateway_of(first).storage
    run_id = "run_left_running"
    storage.insert_run(_stored_run(run_id, "running", session_id="s-left"))
    storage.append_events(
        [Event(run_id, 1, "run.created", "gateway", {}), Event(run_id, 2, "run.started", "gateway", {})]
    )
    await first.close()
    second = await make_gateway(storage=storage_kind, data_dir=tmp_path, schema=first.schema)
    storage = gateway_of(second).storage
    # Repaired at start-up, before anyone reads it.
    assert storage.get_run(run_id).status == "interrupted"
    kinds = [e.kind for e in storage.read_events(run_id)]
    assert kinds == ["run.created", "run.started", "run.interrupted"]
    receipt = await get_run(second, run_id)
    assert receipt["status"] == "interrupted"
    assert await active_run(second, "s-left") is None


async def test_active_run_is_never_terminal_and_a_second_run_queues(make_gateway, fake_llm):
    fake_llm.add(Reply(text="waiting forever", hang=True))
    client = await make_gateway()
    session = "s-queue"
    assert await active_run(client, session) is None
    first = await create(client, run_body("first", sessionId=session))
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    current = await active_run(client, session)
    assert current["hostRunId"] == first["hostRunId"] and current["status"] == "running"

    second = await create(client, run_body("second", sessionId=session))
    seen = await wait_for_kind(client, second["hostRunId"], "run.queued")
    assert "run.started" not in [e["event"] for e in seen]
    assert (await get_run(client, second["hostRunId"]))["status"] == "queued"
    assert (await active_run(client, session))["hostRunId"] == first["hostRunId"]
    assert len(fake_llm.requests) == 1

    cancel = await client.post(f"/v1/runs/{first['hostRunId']}/cancel", json={})
    assert cancel.status == 202
    first_events = await read_stream(client, first["hostRunId"])
    assert first_events[-1]["event"] == "run.cancelled"
    # Right after the terminal event, active-run may show the queued run or nothing, never the first.
    after = await active_run(client, session)
    assert after is None or (after["hostRunId"] == second["hostRunId"] and after["status"] not in TERMINAL_STATUSES)

    second_events = await read_stream(client, second["hostRunId"])
    kinds = [e["event"] for e in second_events]
    assert kinds.index("run.queued") < kinds.index("run.started")
    assert kinds[-1] == "run.completed"
    assert await active_run(client, session) is None
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "second"
    # The session's lock went with its last run (the terminal event is appended after it is left).
    assert len(gateway_of(client).runs._session_locks) == 0


# -- cancel and failures ------------------------------------------------------------------------------


async def test_a_new_runs_stored_row_holds_its_status_and_session_mode_and_then_its_end(make_gateway, fake_llm):
    """A run's row goes to storage with its first commit, as the run is then: running, in its
    session mode (what another instance, a restart's repair or a run listing reads), and its end
    once its events are stored."""
    fake_llm.add(Reply(text="never ends", hang=True))
    client = await make_gateway()
    gateway = gateway_of(client)
    receipt = await create(client, run_body("hang"))
    run_id = receipt["hostRunId"]
    await fake_llm.wait_for_requests(1)  # the turn is running: status and session mode are set
    live = await get_run(client, run_id)
    async with asyncio.timeout(WAIT):
        await gateway.journal.flush()
    stored = gateway.storage.get_run(run_id)
    assert stored is not None and live["sessionMode"] is not None
    assert (stored.status, stored.session_mode) == ("running", live["sessionMode"])
    async with asyncio.timeout(WAIT):
        assert (await client.post(f"/v1/runs/{run_id}/cancel", json={})).status == 202
        await gateway.runs.wait(run_id)
    assert gateway.storage.get_run(run_id).status == "cancelled"
    assert gateway.storage.last_event(run_id).kind == "run.cancelled"


async def test_a_receipt_change_while_the_worker_writes_the_new_row_is_stored(make_gateway, fake_llm, monkeypatch):
    """A change made once the worker has begun writing a new run's row (an agent's permission
    request, its provider run id) is stored by a write of its own: the row may hold the run as
    it was before it."""
    fake_llm.add(Reply(text="never ends", hang=True))
    client = await make_gateway()
    gateway = gateway_of(client)
    writing, release = threading.Event(), threading.Event()
    real_insert = gateway.storage.insert_run

    def held_insert(run: Run) -> None:
        real_insert(run)  # the row, as the run is now
        writing.set()
        assert release.wait(WAIT)

    monkeypatch.setattr(gateway.storage, "insert_run", held_insert)
    receipt = await create(client, run_body("hang"))
    run_id = receipt["hostRunId"]
    try:
        assert await asyncio.to_thread(writing.wait, WAIT)
        await fake_llm.wait_for_requests(1)
        run = await gateway.runs.get(run_id, "local")
        assert run is not None
        gateway.runs._set_status(run, run.status, provider_run_id="prov-after-the-row")  # what `update_receipt` does
    finally:
        release.set()
    async with asyncio.timeout(WAIT):
        await gateway.journal.flush()
    assert gateway.storage.get_run(run_id).provider_run_id == "prov-after-the-row"
    async with asyncio.timeout(WAIT):
        await client.post(f"/v1/runs/{run_id}/cancel", json={})
        await gateway.runs.wait(run_id)


async def test_cancel_a_hanging_upstream(make_gateway, fake_llm):
    fake_llm.add(Reply(text="a long answer that never ends", chunk_size=4, hang=True))
    client = await make_gateway()
    session = "s-cancel"
    receipt = await create(client, run_body("hang", sessionId=session))
    run_id = receipt["hostRunId"]
    await wait_for_kind(client, run_id, "message.delta")
    async with asyncio.timeout(WAIT):
        response = await client.post(f"/v1/runs/{run_id}/cancel", json={})
        assert response.status == 202
        assert (await response.json())["hostRunId"] == run_id
        again = await client.post(f"/v1/runs/{run_id}/cancel", json={})
        assert again.status in (200, 202)
        events = await read_stream(client, run_id)
    assert events[-1]["event"] == "run.cancelled"
    assert sum(e["event"] in TERMINAL_KINDS for e in events) == 1
    final = await get_run(client, run_id)
    assert final["status"] == "cancelled"
    # Cancelling a finished run answers its terminal receipt.
    done = await client.post(f"/v1/runs/{run_id}/cancel", json={})
    assert done.status == 200 and (await done.json())["status"] == "cancelled"
    # The upstream connection was released: the next request of the session works.
    _, next_events = await run_to_end(client, run_body("next", sessionId=session))
    assert next_events[-1]["event"] == "run.completed"
    assert fake_llm.requests[-1]["messages"][-1]["content"] == "next"


async def test_cancel_right_after_create_stops_a_hanging_upstream(make_gateway, fake_llm):
    fake_llm.add(*(Reply(text="never", hang=True) for _ in range(5)))
    client = await make_gateway()
    for _ in range(5):
        receipt = await create(client, run_body("cancel me early"))
        response = await client.post(f"/v1/runs/{receipt['hostRunId']}/cancel", json={})
        assert response.status in (200, 202)
        events = await read_stream(client, receipt["hostRunId"], timeout=10)
        assert events[-1]["event"] == "run.cancelled"


async def test_cancel_a_queued_run_before_it_starts(make_gateway, fake_llm):
    fake_llm.add(Reply(text="hold the session", hang=True))
    client = await make_gateway()
    session = "s-cancel-queued"
    first = await create(client, run_body("first", sessionId=session))
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    second = await create(client, run_body("second", sessionId=session))
    await wait_for_kind(client, second["hostRunId"], "run.queued")
    response = await client.post(f"/v1/runs/{second['hostRunId']}/cancel", json={})
    assert response.status in (200, 202)
    events = await read_stream(client, second["hostRunId"])
    kinds = [e["event"] for e in events]
    assert kinds == ["run.created", "run.queued", "run.cancelled"]
    assert (await get_run(client, second["hostRunId"]))["status"] == "cancelled"
    assert len(fake_llm.requests) == 1
    assert (await active_run(client, session))["hostRunId"] == first["hostRunId"]
    await client.post(f"/v1/runs/{first['hostRunId']}/cancel", json={})
    assert (await read_stream(client, first["hostRunId"]))[-1]["event"] == "run.cancelled"
    assert len(fake_llm.requests) == 1


async def test_upstream_error_fails_the_run_with_its_message(make_gateway, fake_llm):
    fake_llm.add(Reply(status=500, error_message="the model is on fire"))
    client = await make_gateway()
    receipt, events = await run_to_end(client, run_body("break"))
    assert events[-1]["event"] == "run.failed"
    reason = events[-1]["data"]["payload"]["reason"]
    assert "the model is on fire" in reason and "500" in reason
    final = await get_run(client, receipt["hostRunId"])
    assert final["status"] == "failed"
    assert "the model is on fire" in final["error"]


async def test_unreachable_upstream_fails_with_a_clear_reason(make_gateway):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    client = await make_gateway(overrides={"chat_only": {"base_url": url}})
    receipt, events = await run_to_end(client, run_body("anyone there?"))
    assert events[-1]["event"] == "run.failed"
    reason = events[-1]["data"]["payload"]["reason"]
    assert "cannot reach upstream" in reason and url in reason
    assert (await get_run(client, receipt["hostRunId"]))["status"] == "failed"


# -- chat-only transcript ---------------------------------------------------------------------------


async def test_chat_only_rebuilds_the_transcript_on_the_second_turn(make_gateway, fake_llm):
    client = await make_gateway()
    session = "s-transcript"
    first, first_events = await run_to_end(client, run_body("What is the capital of France?", sessionId=session))
    assert (await get_run(client, first["hostRunId"]))["sessionMode"] == "new_session"
    assert "context.warning" not in [e["event"] for e in first_events]
    second, _ = await run_to_end(client, run_body("And of Italy?", sessionId=session))
    messages = fake_llm.requests[-1]["messages"]
    pairs = [(m["role"], m["content"]) for m in messages]
    assert ("user", "What is the capital of France?") in pairs
    assert ("assistant", "echo: What is the capital of France?") in pairs
    assert pairs[-1] == ("user", "And of Italy?")
    assert pairs.index(("user", "What is the capital of France?")) < pairs.index(
        ("assistant", "echo: What is the capital of France?")
    )
    assert (await get_run(client, second["hostRunId"]))["sessionMode"] == "cold_resumed"


async def test_a_queued_turn_and_an_immediate_next_turn_see_the_previous_turns(make_gateway, fake_llm):
    fake_llm.add(Reply(text="first answer", chunk_size=2, delay=0.01))
    client = await make_gateway()
    session = "s-back-to-back"
    first = await create(client, run_body("first question", sessionId=session))
    second = await create(client, run_body("second question", sessionId=session))  # queued behind it
    await read_stream(client, first["hostRunId"])
    await read_stream(client, second["hostRunId"])
    pairs = [(m["role"], m["content"]) for m in fake_llm.requests[1]["messages"]]
    assert ("user", "first question") in pairs and ("assistant", "first answer") in pairs
    # Sent the moment the previous terminal event arrives: still sees both earlier turns.
    third, third_events = await run_to_end(client, run_body("third question", sessionId=session))
    assert "run.queued" not in [e["event"] for e in third_events]
    pairs = [(m["role"], m["content"]) for m in fake_llm.requests[2]["messages"]]
    assert ("user", "second question") in pairs and ("assistant", "echo: second question") in pairs
    assert ("assistant", "first answer") in pairs
    assert (await get_run(client, third["hostRunId"]))["sessionMode"] == "cold_resumed"


async def test_bare_short_first_turn_gets_a_context_warning(make_gateway):
    client = await make_gateway()
    _, events = await run_to_end(client, run_body("ok"))
    warnings = [e for e in events if e["event"] == "context.warning"]
    assert len(warnings) == 1 and warnings[0]["data"]["payload"]["message"]
    assert events[-1]["event"] == "run.completed"
    # With context, or as a later turn, a short reply is fine.
    _, with_context = await run_to_end(client, run_body("ok", context={"target": {"path": "notes/a.md"}}))
    assert "context.warning" not in [e["event"] for e in with_context]
    session = "s-short"
    await run_to_end(client, run_body("Draft a title", sessionId=session))
    _, later = await run_to_end(client, run_body("ok", sessionId=session))
    assert "context.warning" not in [e["event"] for e in later]


# -- actors ---------------------------------------------------------------------------------------------


async def test_tokens_are_required_and_actors_are_isolated(make_gateway, fake_llm):
    fake_llm.add(Reply(text="alice only", hang=True))
    client = await make_gateway(tokens=TOKENS)
    for headers in ({}, {"Authorization": "Bearer nope-nope-nope-nope"}, {"Authorization": "Basic xyz"}):
        error = await json_error(await client.post("/v1/runs", json=run_body(), headers=headers), 401)
        assert error["code"] == "unauthorized"
        await json_error(await client.get("/v1/agents", headers=headers), 401)
    session = "s-alice"
    receipt = await create(client, run_body("secret", sessionId=session), ALICE)
    run_id = receipt["hostRunId"]
    assert receipt["actorId"] == "alice"
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    for method, path in (
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", f"/v1/runs/{run_id}/events"),
        ("GET", f"/v1/runs/{run_id}/stream"),
        ("POST", f"/v1/runs/{run_id}/cancel"),
    ):
        error = await json_error(await client.request(method, path, headers=BOB), 404)
        assert error["code"] == "run_not_found"
    assert await active_run(client, session, BOB) is None
    assert (await active_run(client, session, ALICE))["hostRunId"] == run_id
    # Bob's cancel did nothing: the run is still running for Alice.
    assert (await get_run(client, run_id, ALICE))["status"] == "running"
    assert (await client.post(f"/v1/runs/{run_id}/cancel", headers=ALICE)).status == 202
    events = await read_stream(client, run_id, headers=ALICE)
    assert events[-1]["event"] == "run.cancelled"
    # Health and the OpenAPI file need no token.
    assert (await client.get("/v1/health")).status == 200
    assert (await client.get("/openapi.json")).status == 200


# -- bad input --------------------------------------------------------------------------------------


async def test_bad_requests_get_json_errors_never_500(make_gateway):
    client = await make_gateway(overrides={"gateway": {"max_body_bytes": 2048}})
    json_header = {"Content-Type": "application/json"}
    cases: list[tuple[Any, int, str | None]] = [
        (b"{not json", 400, "invalid_json"),
        (b"", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_request"),
        (b'"a string"', 400, "invalid_request"),
        (b"42", 400, "invalid_request"),
        (b"null", 400, "invalid_request"),
        (b"\xff\xfe", 400, "invalid_json"),
    ]
    for raw, status, code in cases:
        error = await json_error(await client.post("/v1/runs", data=raw, headers=json_header), status)
        assert code is None or error["code"] == code, (raw, error)

    good = run_body("fine")
    unknown = await json_error(await client.post("/v1/runs", json=dict(good, agentId="nobody")), 400)
    assert unknown["code"] == "unknown_agent"
    assert "chat-only" in unknown["knownAgents"]
    for missing in ("requestId", "agentId", "sessionId", "message"):
        body = {k: v for k, v in good.items() if k != missing}
        error = await json_error(await client.post("/v1/runs", json=body), 400)
        assert missing in error["message"]
    bad_values: list[dict[str, Any]] = [
        {"message": ""},
        {"message": "   "},
        {"message": 7},
        {"requestId": ""},
        {"requestId": 12},
        {"sessionId": "x" * 300},
        {"context": "not an object"},
        {"options": [1]},
        {"context": {"allowedRoots": "notes/"}},
        {"context": {"allowedRoots": [1]}},
        {"parentRunId": 5},
    ]
    for change in bad_values:
        error = await json_error(await client.post("/v1/runs", json=dict(good, **change)), 400)
        assert error["code"] == "invalid_request", change
    error = await json_error(await client.post("/v1/runs", json=dict(good, surprise=1, other=2)), 400)
    assert "surprise" in error["message"] and "other" in error["message"]
    error = await json_error(await client.post("/v1/runs", json=dict(good, message="x" * 5000)), 413)
    assert error["code"] == "body_too_large"
    await json_error(await client.post("/v1/runs", data=b"{}", headers={"Content-Type": "text/plain"}), 415)
    await json_error(await client.get("/v1/runs/run_does_not_exist"), 404)
    await json_error(await client.get("/v1/runs/run_does_not_exist/events"), 404)
    await json_error(await client.get("/v1/runs/run_does_not_exist/stream"), 404)
    await json_error(await client.post("/v1/runs/run_does_not_exist/cancel", json={}), 404)
    await json_error(await client.get("/v1/nothing-here"), 404)
    await json_error(await client.delete("/v1/runs"), 405)
    # None of that created a run or broke the gateway.
    receipt, events = await run_to_end(client, good)
    assert events[-1]["event"] == "run.completed"
    assert receipt["requestId"] == good["requestId"]


# -- agents, health, OpenAPI -------------------------------------------------------------------------


async def test_agents_and_health(make_gateway):
    client = await make_gateway()
    response = await client.get("/v1/agents")
    assert response.status == 200
    body = await response.json()
    assert body["schema"] == "gateway.agent_descriptors.v1"
    agents = {a["agentId"]: a for a in body["agents"]}
    chat = agents["chat-only"]
    assert chat["schema"] == "gateway.agent_descriptor.v1"
    for key in ("displayName", "provider", "capabilities", "availability"):
        assert key in chat
    assert chat["availability"]["available"] is True
    health = await client.get("/v1/health")
    assert health.status == 200
    info = await health.json()
    assert info["status"] == "ok" and "chat-only" in info["agents"]


def _normalise(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


async def test_openapi_lists_exactly_the_served_routes(make_gateway):
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.")
    documented = {
        (_normalise(path), method.upper())
        for path, item in spec["paths"].items()
        for method in item
        if method.lower() in {"get", "post", "put", "patch", "delete"}
    }
    served = set()
    for resource in client.app.router.resources():
        path = resource.canonical
        if path in CONSOLE_ROUTES:  # the web console's page and files: not API routes
            continue
        for route in resource:
            if route.method in ("HEAD", "OPTIONS"):
                continue
            served.add((_normalise(path), route.method))
    assert served == documented
    assert json.dumps(spec)  # serialisable as served


@pytest.mark.parametrize("nowait", ["answers", "refuses"])
async def test_the_request_look_up_runs_on_the_loop_when_storage_can_answer_at_once(
    nowait: str, make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite answers a new run's idempotency look-up on the loop (no worker trip before the
    first event); a look-up it refuses (a locked database) goes to a worker. Either way a new
    run is 201 and its repeat 200 with the same run, once its row is stored too."""
    client = await make_gateway()
    storage = gateway_of(client).storage
    on_worker: list[tuple[str, ...]] = []
    find_on_worker = storage.find_run_by_request

    def counted(*key: str) -> Run | None:
        on_worker.append(key)
        return find_on_worker(*key)

    def refused(*key: str) -> Run | None:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(storage, "find_run_by_request", counted)
    if nowait == "refuses":
        monkeypatch.setattr(storage, "find_run_by_request_nowait", refused)
    body = run_body("go")
    receipt, _events = await run_to_end(client, body)  # created (201), then its row stored
    repeat = await client.post("/v1/runs", json=body)
    assert repeat.status == 200
    assert (await repeat.json())["hostRunId"] == receipt["hostRunId"]
    assert len(on_worker) == (0 if nowait == "answers" else 2), on_worker
