"""The Responses stream's text-delta frames, built from a template on the hot path, are byte for
byte the frames the generic path builds (a dict through orjson, as every other event's frame):
for hostile text (quotes, backslashes, control characters, U+2028, emoji, ``%`` in the text and in
the run id), in any batching, with merged, replayed and resumed deltas. And an idle encoded
stream (chat completions, Responses) is written to from the journal's publish itself, as the
native stream is, not a loop turn later from its writer task; an encoder error there drops that
stream (never buffering a half-encoded batch) and the run goes on.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import aiohttp
import orjson
import pytest

from agent_gateway import Event, Run
from agent_gateway.plugins.openai_compat.mapping import REPLAY_SOURCE, ResponseStream, _span, _text
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import MakeGateway, gateway_of

WAIT = 20.0
HOSTILE = [
    'say "hi"',
    "back\\slash \\u0041 \\",
    "\x00\x01\x08\t\n\r\x1b\x1f\x7f",
    "\u2028line\u2029para\u0085",
    "😀 astral 𝄞 and é",
    "%d %s %b %% %",
    "</script><!--",
    "",
    "x" * 16,
]


class GenericDeltas(ResponseStream):
    """The text delta's frame as any other frame is built: fields in a dict, through `_emit`."""

    def encode(self, events: list[Event]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if event.source == REPLAY_SOURCE:
                continue
            if event.kind != "message.delta":
                self._encode_other(out, event.kind, event)
                continue
            if self._message is None:
                self._open_message(out)
            text = _text(event.payload)
            self._message_parts.append(text)
            self.number += _span(event.payload) - 1  # `_emit` counts the last seq it covers
            sent = self.cut_texts.pop(event.seq, text) if self.number + 1 > self.starting_after else text
            index = self._message
            assert index is not None
            self._emit(out, "response.output_text.delta", self._at(index, logprobs=[], delta=sent))
        return b"".join(out)


def _run(run_id: str = "run_%d%%b\"'") -> Run:
    return Run(
        host_run_id=run_id,
        request_id="q",
        agent_id="agent%s",
        provider="p",
        session_id="s",
        actor_id="a",
        workspace_id="w",
    )


def _events(run: Run) -> list[Event]:
    """A run with reasoning, hostile deltas, a delta the journal compacted (three seqs in one), a
    replayed delta (never output), a tool call and usage in between."""
    seq = 0

    def event(kind: str, payload: dict[str, Any], source: str = "agent") -> Event:
        nonlocal seq
        seq += 1
        return Event(run.host_run_id, seq, kind, source, payload, 1000 + seq)

    events = [event("run.created", {}, "gateway"), event("run.started", {}, "gateway")]
    events += [event("thought.delta", {"text": text}) for text in HOSTILE[:3]]
    events += [event("message.delta", {"text": text}) for text in HOSTILE]
    events.append(event("message.delta", {"text": "old answer"}, REPLAY_SOURCE))
    seq += 2  # a compacted delta keeps the seq of the last delta it stands for
    events.append(event("message.delta", {"text": "merged \"'%", "mergedFrom": seq - 2, "mergedCount": 3}))
    events.append(event("message.delta", {"text": 42}))  # not a text: an empty delta
    events.append(event("tool.started", {"toolCallId": "t1", "tool": "grep", "kind": "search"}))
    events += [event("message.delta", {"text": text}) for text in reversed(HOSTILE)]
    events.append(event("usage.updated", {"inputTokens": 3, "outputTokens": 5}))
    events.append(event("tool.completed", {"toolCallId": "t1", "tool": "grep"}))
    events.append(event("run.completed", {}, "gateway"))
    return events


def _encode(stream: ResponseStream, events: list[Event], size: int) -> bytes:
    return b"".join(stream.encode(events[start : start + size]) for start in range(0, len(events), size))


@pytest.mark.parametrize("batch", [1, 2, 5, 1000])
@pytest.mark.parametrize("reasoning", [True, False])
def test_template_frames_are_the_generic_frames(batch: int, reasoning: bool) -> None:
    run = _run()
    events = _events(run)
    sent = _encode(ResponseStream(run, reasoning=reasoning), events, batch)
    assert sent == _encode(GenericDeltas(run, reasoning=reasoning), events, batch)
    # The texts survive the trip: every delta frame parses back to its text.
    deltas = [
        json.loads(line[6:])["delta"]
        for line in sent.split(b"\n")
        if line.startswith(b"data: ") and b'"type":"response.output_text.delta"' in line
    ]
    assert deltas == [*HOSTILE, "merged \"'%", "", *reversed(HOSTILE)]
    numbers = [json.loads(line[6:])["sequence_number"] for line in sent.split(b"\n") if line.startswith(b"data: ")]
    assert numbers == sorted(set(numbers))  # increasing: a compacted delta takes three numbers


def test_resumed_streams_skip_the_same_frames() -> None:
    run = _run("run_resumed")
    events = _events(run)
    merged = next(e for e in events if "mergedCount" in e.payload)
    last = ResponseStream(run, reasoning=True)
    last.fold(events)
    for after in range(-1, last.number + 1):
        streams = [cls(run, reasoning=True, starting_after=after) for cls in (ResponseStream, GenericDeltas)]
        for stream in streams:  # a resume inside the compacted delta gets the rest of its text
            stream.cut_texts[merged.seq] = "rest"
        assert _encode(streams[0], events, 3) == _encode(streams[1], events, 3), after


def test_a_lone_surrogate_fails_alike() -> None:
    """The journal cannot store one (its payload is JSON); an encoder that met one raises as before."""
    run = _run()
    delta = Event(run.host_run_id, 3, "message.delta", "agent", {"text": "a\ud800b"}, 1)
    for cls in (ResponseStream, GenericDeltas):
        with pytest.raises(orjson.JSONEncodeError):
            cls(run, reasoning=False).encode([delta])


async def _eventually(holds: Any, turns: int = 200) -> bool:
    """Whether `holds()` becomes true within `turns` 10 ms turns of the loop."""
    for _ in range(turns):
        if holds():
            return True
        await asyncio.sleep(0.01)
    return bool(holds())


async def _read_until(response: aiohttp.ClientResponse, seen: bytes, marker: bytes) -> bytes:
    """``seen`` plus what the stream sends until ``marker`` is in it (bounded: 1,000 chunks, and
    the caller's WAIT)."""
    for _ in range(1000):
        if marker in seen:
            break
        seen += await response.content.readany()
    return seen


@pytest.mark.parametrize(
    ("path", "body", "marker"),
    [
        ("/v1/responses", {"model": "chat-only", "input": "hi", "stream": True}, b'"delta":"from publish \\"%"'),
        (
            "/v1/chat/completions",
            {"model": "chat-only", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            b'"content":"from publish \\"%"',
        ),
    ],
)
async def test_an_idle_encoded_stream_is_written_from_publish(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, path: str, body: dict[str, Any], marker: bytes
) -> None:
    fake_llm.add(Reply(text="first", hang=True))
    client = await make_gateway()
    gateway = gateway_of(client)
    async with asyncio.timeout(WAIT):
        response = await client.post(path, json=body)
        assert response.status == 200, await response.text()
        seen = await _read_until(response, b"", b"first")
        found = re.search(rb'"(?:resp_|chatcmpl-)(run_[0-9a-f]+)"', seen)
        assert found is not None, seen
        run_id = found[1].decode()
        subscribers = gateway.bus._subscribers[run_id]
        # The stream waits with nothing buffered: it takes the next batch from publish itself.
        assert await _eventually(lambda: all(sub.write_directly is not None for sub in subscribers))
        delivered = gateway.stream_stats.delivered
        gateway.journal.append_nowait(run_id, "message.delta", {"text": 'from publish "%'}, "agent")
        gateway.journal.publish()
        assert gateway.stream_stats.delivered == delivered + 1  # written before any loop turn
        seen = await _read_until(response, seen, marker)
        assert marker in seen
        cancelled = await client.post(f"/v1/runs/{run_id}/cancel", json={})  # (the fake model hangs)
        assert cancelled.status < 300, await cancelled.text()
        response.close()


async def test_an_encoder_error_in_a_direct_write_ends_that_stream_not_the_run(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    encode = ResponseStream.encode

    def failing(self: ResponseStream, events: list[Event]) -> bytes:
        if any(event.payload.get("text") == "boom" for event in events):
            raise RuntimeError("an encoder bug")
        return encode(self, events)

    monkeypatch.setattr(ResponseStream, "encode", failing)
    fake_llm.add(Reply(text="first", hang=True))
    client = await make_gateway()
    gateway = gateway_of(client)
    body = {"model": "chat-only", "input": "hi", "stream": True}
    async with asyncio.timeout(WAIT):
        response = await client.post("/v1/responses", json=body)
        assert response.status == 200, await response.text()
        seen = await _read_until(response, b"", b"first")
        found = re.search(rb'"resp_(run_[0-9a-f]+)"', seen)
        assert found is not None, seen
        run_id = found[1].decode()
        subscribers = gateway.bus._subscribers[run_id]
        assert await _eventually(lambda: all(sub.write_directly is not None for sub in subscribers))
        gateway.journal.append_nowait(run_id, "message.delta", {"text": "boom"}, "agent")
        gateway.journal.publish()  # raises nothing: the run goes on
        # The stream is dropped, its half-encoded batch never buffered for a second encoding.
        for _ in range(1000):
            try:
                chunk = await response.content.readany()
            except aiohttp.ClientPayloadError:
                break
            if not chunk:
                break
            seen += chunk
        assert b"boom" not in seen
        assert "unhandled error on the stream of " + run_id in caplog.text
        assert "buffering instead" not in caplog.text  # (its writer would encode the batch again)
        assert await _eventually(lambda: not gateway.bus.subscriber_count(run_id))
        after = gateway.journal.append_nowait(run_id, "message.delta", {"text": "after"}, "agent")
        assert after is not None  # the run still takes events
        cancelled = await client.post(f"/v1/runs/{run_id}/cancel", json={})
        assert cancelled.status < 300, await cancelled.text()
