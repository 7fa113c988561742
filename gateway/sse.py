"""The SSE writer: replay from the journal, then tail the bus, with no gap and no duplicate.

Each event is serialised once (`Event.wire_json`) and a client gets its events in batched
writes. A client that falls behind its buffer is switched back to replay from the journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp_sse import EventSourceResponse

from agent_gateway.bus import Bus
from agent_gateway.journal import Journal
from agent_gateway.models import Event, dumps

REPLAY_PAGE = 2000
REPLAY_FIRST_PAGE = 200  # a resumed client sees its first events after a short read, not a full page
WRITE_BATCH = 256
SEND_TIMEOUT = 60.0


def encode_events(events: list[Event], project: Callable[[Event], Any] | None = None) -> bytes:
    if project is None:
        return b"".join([event.sse_frame() for event in events])  # each frame cached on its event
    parts: list[bytes] = []
    for event in events:
        projected = project(event)
        if projected is None:
            continue
        data = projected.encode() if isinstance(projected, str) else dumps(projected)
        parts.append(b"id: %s\nevent: %s\ndata: %s\n\n" % (event.cursor.encode(), event.kind.encode(), data))
    return b"".join(parts)


def _shared_frames(bus: Bus, topic: str, events: list[Event]) -> bytes:
    """The frames of `events`, encoded once for every client that writes the same batch. The same
    first and last event objects and as many events as seqs between them mean the same events
    (a merged delta stands for two seqs, so a batch holding one is shorter than its span)."""
    first, last, count = events[0], events[-1], len(events)
    cached = bus.shared_frames.get(topic)
    if cached is not None and cached[0] is first and cached[1] is last and cached[2] == count:
        return cached[3]
    blob = encode_events(events)
    if count == last.seq - first.seq + 1:
        bus.shared_frames[topic] = (first, last, count, blob)
    return blob


class StreamStats:
    def __init__(self) -> None:
        self.delivered = 0
        self.replays = 0
        self.merges = 0
        self.open_streams = 0


async def stream_run(
    request: web.Request,
    *,
    topic: str,
    journal: Journal,
    bus: Bus,
    after_seq: int,
    is_finished: Callable[[], bool],
    capacity: int,
    heartbeat: float,
    stats: StreamStats,
    project: Callable[[Event], Any] | None = None,
    read: Callable[[int, int], Any] | None = None,
) -> web.StreamResponse:
    """Stream `topic` (a run id) after `after_seq` until its terminal event.

    `is_finished()` tells whether the topic can have no later events (a finished run whose
    terminal event the client already has); `read(after, limit)` overrides the journal read.
    """
    response = EventSourceResponse(ping_interval=max(heartbeat, 0.1), send_timeout=SEND_TIMEOUT)
    response.headers["X-Accel-Buffering"] = "no"
    await response.prepare(request)
    reader = read or (lambda after, limit: journal.read(topic, after, limit))
    subscriber = bus.subscribe(topic, capacity)
    wakeup = subscriber.wakeup
    transport = request.transport
    high_water = transport.get_write_buffer_limits()[1] if transport is not None else 0
    loop = asyncio.get_running_loop()
    # The heartbeat: one timer per stream (not one per wait), waking the writer to check the peer.
    beat = False
    beat_handle: asyncio.TimerHandle | None = None

    def on_beat() -> None:
        nonlocal beat, beat_handle
        beat = True
        wakeup.set()
        beat_handle = loop.call_later(heartbeat, on_beat)

    beat_handle = loop.call_later(heartbeat, on_beat)
    stats.open_streams += 1
    last = after_seq
    replaying = True
    sent = False
    finished = False
    chunked = "chunked" in response.headers.get(hdrs.TRANSFER_ENCODING, "").lower()
    # Writing from `publish` bypasses the response's writer: only for plain (unprojected,
    # uncompressed) streams.
    can_write_directly = project is None and transport is not None and not response.compression

    def write_directly(events: list[Event], frames: bytes | None) -> bool:
        """Write a just-published batch to the socket from `publish`, while this client waits with
        nothing buffered: no task switch per client per batch. Declines (the batch is then
        buffered as usual) unless the transport's own buffer is empty, so at most one batch ever
        waits there and no drain or send timer is needed."""
        nonlocal last, finished
        assert transport is not None
        if events[0].seq <= last or transport.is_closing():
            return False
        if transport.get_write_buffer_size():
            return False  # the client is not keeping up: buffer (merge, replay) as usual
        blob = frames if frames is not None else encode_events(events)
        transport.write(b"%x\r\n%b\r\n" % (len(blob), blob) if chunked else blob)
        stats.delivered += len(events)
        last = events[-1].seq
        if events[-1].is_terminal:  # nothing follows a run's terminal event
            finished = True
            subscriber.write_directly = None
            wakeup.set()
        return True
    try:
        while True:
            if replaying or subscriber.needs_replay:
                if subscriber.needs_replay:
                    stats.replays += 1
                # Dropping the buffer and snapshotting the journal happen in one step.
                subscriber.needs_replay = False
                subscriber.buffer.clear()
                subscriber.wakeup.clear()
                page = REPLAY_PAGE if last > after_seq else REPLAY_FIRST_PAGE
                events = await reader(last, page)
                replaying = len(events) >= page
                if not events and not replaying and is_finished():
                    break
            else:
                if not subscriber.buffer:
                    if beat:  # a heartbeat period went by with nothing to send
                        beat = False
                        wakeup.clear()
                        if not response.is_connected():
                            break
                    if sent and can_write_directly:  # (headers are out: aiohttp sends them with the first write)
                        subscriber.write_directly = write_directly
                    await wakeup.wait()
                    subscriber.write_directly = None
                    if finished:
                        break
                    continue
                taken = subscriber.take(WRITE_BATCH)
                events = taken
                if taken and taken[0].seq <= last:  # seqs increase: only a head can be stale
                    events = [e for e in taken if e.seq > last]
                    if not events and taken[-1].is_terminal:
                        break  # the client's cursor is already past the end of the run
            if not events:
                continue
            blob = encode_events(events, project) if project is not None else _shared_frames(bus, topic, events)
            idle = transport is not None and not transport.get_write_buffer_size()
            if sent and idle and len(blob) + 64 <= high_water:
                # Headers sent, nothing queued (so not paused) and the batch fits below the
                # high-water mark: the write cannot pause the transport, so it cannot wait for a
                # drain, and needs no send timer.
                await response.write(blob)
            else:
                async with asyncio.timeout(SEND_TIMEOUT):
                    await response.write(blob)
            sent = True
            stats.delivered += len(events)
            last = events[-1].seq
            if events[-1].is_terminal:  # nothing follows a run's terminal event
                break
    except (ConnectionResetError, TimeoutError):
        pass  # the client went away or stalled; it resumes with Last-Event-ID
    finally:
        if beat_handle is not None:
            beat_handle.cancel()
        stats.merges += subscriber.merges
        bus.unsubscribe(subscriber)
        stats.open_streams -= 1
    try:
        response.stop_streaming()
        await response.write_eof()
    except (ConnectionResetError, RuntimeError):
        pass
    return response
