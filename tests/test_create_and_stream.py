"""Create-and-stream: `POST /v1/runs` with `Accept: text/event-stream` (or `?stream=1`) answers
with the new run's SSE stream, in one round trip.

- Every event from seq 1 (`run.created` first, holding the receipt), nothing merged, the run's id
  and Location in the headers, 201.
- A repeat with the same requestId streams the same run (200), from the start or after its
  `Last-Event-ID`.
- The first event leaves in the write that carries the response headers: a raw client's first
  read holds both.
- An Accept naming JSON too, or `?stream=0`, keeps the JSON receipt; a bad `stream` value or
  `Last-Event-ID` is a 400 and creates nothing; a refused body is the usual JSON error.
"""

from __future__ import annotations

import asyncio
from asyncio.selector_events import _SelectorSocketTransport
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway, gateway_of, run_body, sse_events

SSE = {"Accept": "text/event-stream"}


async def create_and_stream(
    client: TestClient, body: dict[str, Any], headers: dict[str, str] | None = None, query: str = ""
) -> tuple[int, dict[str, str], list[dict[str, Any]]]:
    async with asyncio.timeout(WAIT):
        async with client.post("/v1/runs" + query, json=body, headers=headers or {}) as response:
            assert response.content_type == "text/event-stream", await response.text()
            events = [event async for event in sse_events(response)]
            return response.status, dict(response.headers), events


def check_whole_run(events: list[dict[str, Any]], run_id: str) -> None:
    seqs = [int(e["id"]) for e in events]
    assert seqs == list(range(1, len(events) + 1)), seqs[:20]
    assert events[0]["event"] == "run.created"
    assert events[0]["data"]["payload"]["receipt"]["hostRunId"] == run_id
    assert events[-1]["event"] in TERMINAL_KINDS
    assert all(e["data"]["hostRunId"] == run_id for e in events)
    assert not [e for e in events if "mergedCount" in e["data"]["payload"]]


async def test_create_and_stream_sends_every_event_from_seq_1_unmerged(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    text = "".join(f"{n:05d}" for n in range(3000))  # 3,000 deltas: beyond one buffer's worth
    fake_llm.add(Reply(text, chunk_size=5))
    client = await make_gateway()
    body = run_body("go")
    status, headers, events = await create_and_stream(client, body, SSE)
    assert status == 201
    run_id = headers["X-Host-Run-Id"]
    assert headers["Location"] == f"/v1/runs/{run_id}"
    check_whole_run(events, run_id)
    deltas = [e["data"]["payload"]["text"] for e in events if e["event"] == "message.delta"]
    assert "".join(deltas) == text and len(deltas) == 3000
    assert events[-1]["event"] == "run.completed"
    receipt = await (await client.get(f"/v1/runs/{run_id}")).json()
    assert receipt["requestId"] == body["requestId"] and receipt["status"] == "completed"
    assert gateway_of(client).stream_stats.merges == 0


async def test_a_repeat_with_the_same_request_id_streams_the_same_run(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    body = run_body("hello")
    status, headers, first = await create_and_stream(client, body, query="?stream=1")
    assert status == 201
    run_id = headers["X-Host-Run-Id"]
    again_status, again_headers, again = await create_and_stream(client, body, SSE)
    assert again_status == 200 and again_headers["X-Host-Run-Id"] == run_id
    assert [(e["id"], e["event"]) for e in again] == [(e["id"], e["event"]) for e in first]
    check_whole_run(again, run_id)
    # A retry that already holds some events resumes after them.
    resumed_status, _, resumed = await create_and_stream(client, body, {**SSE, "Last-Event-ID": first[1]["id"]})
    assert resumed_status == 200
    assert [e["id"] for e in resumed] == [e["id"] for e in first[2:]]
    assert len(fake_llm.requests) == 1  # one run, one upstream call


async def test_json_stays_the_default_and_bad_stream_requests_create_nothing(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    gw = gateway_of(client)
    both = await client.post("/v1/runs", json=run_body(), headers={"Accept": "text/event-stream, application/json"})
    assert both.status == 201 and both.content_type == "application/json"
    assert both.headers["X-Host-Run-Id"] == (await both.json())["hostRunId"]
    off = await client.post("/v1/runs?stream=0", json=run_body(), headers=SSE)
    assert off.status == 201 and off.content_type == "application/json"
    created = gw.runs.created
    bad_flag = await client.post("/v1/runs?stream=yes", json=run_body())
    assert bad_flag.status == 400 and (await bad_flag.json())["error"]["code"] == "invalid_request"
    bad_cursor = await client.post("/v1/runs", json=run_body(), headers={**SSE, "Last-Event-ID": "x1"})
    assert bad_cursor.status == 400 and (await bad_cursor.json())["error"]["code"] == "invalid_cursor"
    unknown = await client.post("/v1/runs", json=run_body(agentId="nobody"), headers=SSE)
    assert unknown.status == 400 and unknown.content_type == "application/json"
    assert (await unknown.json())["error"]["code"] == "unknown_agent"
    assert gw.runs.created == created


async def test_the_first_event_leaves_with_the_opening_write(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run.created` goes out in the stream's opening write, with the headers in one send, not a
    loop turn later (a turn that a busy runtime's slice makes a millisecond long)."""
    written: dict[int, list[bytes]] = {}
    write = _SelectorSocketTransport.write

    def recording_write(transport: _SelectorSocketTransport, data: Any) -> None:
        written.setdefault(id(transport), []).append(bytes(data))
        write(transport, data)

    fake_llm.add(Reply("hello"))
    client = await make_gateway()
    monkeypatch.setattr(_SelectorSocketTransport, "write", recording_write)
    status, _, events = await create_and_stream(client, run_body("go"), SSE)
    assert status == 201 and events[0]["event"] == "run.created"
    (stream,) = [writes for writes in written.values() if writes[0].startswith(b"HTTP/1.1 201")]
    _, _, body = stream[0].partition(b"\r\n\r\n")
    assert body.count(b"\r\n") == 2  # one chunk: the opening comment and the first event
    assert b"\nid: 000000000000000001\nevent: run.created\n" in body, stream[:3]
