"""`sse_frames`, the one SSE frame builder: plain (wire JSON) and projected frames."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

from agent_gateway.models import Event, sse_frames


def parse(blob: bytes) -> list[dict[str, str]]:
    """Frames as an EventSource reads them: fields per blank-line-separated block."""
    frames = []
    assert blob.endswith(b"\n\n")
    for block in blob.decode().split("\n\n")[:-1]:
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            assert name in ("id", "event", "data") and name not in fields, block
            fields[name] = value
        frames.append(fields)
    return frames


EVENTS = [
    Event("run_f", 1, "run.started", "gateway", {"agentId": "echo"}, 1000),
    Event("run_f", 2, "message.delta", "echo", {"text": 'two\nlines \u2028 and "quotes"'}, 1001),
    Event("run_f", 3, "odd\nkind", "echo", {"n": 2**70}, 1002),  # an int orjson cannot write
    Event("run_f", 4, "run.completed", "gateway", {"status": "completed"}, 1003),
]


def test_a_frame_per_event_with_the_padded_seq_the_kind_and_the_wire_json() -> None:
    blob = sse_frames(EVENTS)
    frames = parse(blob)
    assert [f["id"] for f in frames] == [
        "000000000000000001",
        "000000000000000002",
        "000000000000000003",
        "000000000000000004",
    ]
    assert [f["event"] for f in frames] == ["run.started", "message.delta", "odd kind", "run.completed"]
    assert [json.loads(f["data"]) for f in frames] == [e.to_wire() for e in EVENTS]
    # An event's own frame is the same bytes, and the joined frames are its frames joined.
    fresh = [Event(e.host_run_id, e.seq, e.kind, e.source, e.payload, e.created_at) for e in EVENTS]
    assert b"".join(e.sse_frame() for e in fresh) == blob
    assert sse_frames(fresh) == blob  # (now from the frames cached on the events)


def test_projected_frames_carry_the_projection_as_json_and_skip_hidden_events() -> None:
    def project(event: Event) -> Any:
        if event.kind == "run.started":
            return None  # hidden
        if event.kind == "message.delta":
            return event.payload["text"]  # a JSON string, even with a line break in it
        return {"kind": event.kind, "seq": event.seq}

    frames = parse(sse_frames(EVENTS, project))
    assert [f["id"] for f in frames] == ["000000000000000002", "000000000000000003", "000000000000000004"]
    assert [f["event"] for f in frames] == ["message.delta", "odd kind", "run.completed"]
    assert [json.loads(f["data"]) for f in frames] == [
        EVENTS[1].payload["text"],
        {"kind": "odd\nkind", "seq": 3},
        {"kind": "run.completed", "seq": 4},
    ]
    assert sse_frames(EVENTS, lambda event: None) == b""


def test_an_event_keeps_its_payload_json_in_a_buffer_of_its_own_size() -> None:
    """orjson (3.12 and later) returns even a small document in a 4 KB buffer. An event keeps its
    payload JSON (for storage and for frames) as long as it waits for storage or sits in a
    client's buffer: it must keep a right-sized copy, or 20,000 waiting deltas hold 80 MB."""
    published = [Event("run_m", seq, "message.delta", "agent", {"text": "x" * 16}) for seq in range(1, 1001)]
    asked = [Event("run_m", seq, "tool.completed", "agent", {"status": "ok"}) for seq in range(1001, 2001)]
    tracemalloc.start()
    try:
        sse_frames(published)  # the publish path caches each payload's JSON
        for event in asked:
            event.payload_bytes()  # the storage path
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(e._payload_bytes == b'{"text":"xxxxxxxxxxxxxxxx"}' for e in published)
    assert held < 2000 * 256, f"{held / 2000:.0f} bytes per event for its payload JSON"
