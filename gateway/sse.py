"""The SSE writer: replay from the journal, then tail the bus, with no gap and no duplicate.

A client's events go out in batched writes of frames built by `models.sse_frames` (clients in step
with a run share one encoding of each batch). A client that falls behind its buffer is switched
back to replay from the journal. The response headers go out with a first comment as the stream
opens; a client that stops reading is cut off after the send timeout; at shutdown
(`StreamStats.stop_all`) every stream writes what it has buffered and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import hdrs, web
from aiohttp_sse import EventSourceResponse

from agent_gateway.bus import Bus
from agent_gateway.http_server import JsonErrorRequestHandler
from agent_gateway.journal import Journal
from agent_gateway.models import Event, sse_frames

REPLAY_PAGE = 2000
REPLAY_FIRST_PAGE = 200  # a resumed client sees its first events after a short read, not a full page
WRITE_BATCH = 256
SEND_TIMEOUT = 60.0  # default of [gateway] stream_send_timeout_seconds
OPENING_COMMENT = b": stream open\n\n"


def encode_events(events: list[Event], project: Callable[[Event], Any] | None = None) -> bytes:
    """The SSE frames of `events` (projected by `project`, if given), joined."""
    if project is None:
        return b"".join([event.sse_frame() for event in events])  # each frame cached on its event
    return sse_frames(events, project)


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
        self.streams: set[RunStream] = set()  # the open ones, for shutdown
        self._none_open: asyncio.Event | None = None

    def stop_all(self, keep: Callable[[str], bool] = lambda topic: False) -> None:
        """Ask every open stream whose topic `keep` does not want to end (after writing what it has
        buffered); its client resumes with Last-Event-ID."""
        for stream in list(self.streams):
            if not keep(stream.topic):
                stream.stop()

    async def wait_closed(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every open stream to end; whether they all did."""
        if not self.streams:
            return True
        self._none_open = self._none_open or asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._none_open.wait()
        return not self.streams

    def _opened(self, stream: RunStream) -> None:
        self.open_streams += 1
        self.streams.add(stream)
        if self._none_open is not None:
            self._none_open.clear()

    def _closed(self, stream: RunStream) -> None:
        self.open_streams -= 1
        self.streams.discard(stream)
        if not self.streams and self._none_open is not None:
            self._none_open.set()


class RunStream:
    """One client's stream of a topic on a prepared response: pages of replay from the journal,
    then the live tail of its bus subscription, until the topic's terminal event or the client
    leaves.

    Each step of `run` gets the next batch (`_replay_page`, or `_tail` once replay caught up) and
    `_send`s it. While the writer waits with nothing buffered, `publish` may write a batch straight
    to the socket (`_write_directly`). A heartbeat timer wakes the writer to check that the peer is
    still there."""

    def __init__(
        self,
        request: web.Request,
        response: EventSourceResponse,
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
        send_timeout: float = SEND_TIMEOUT,
        encode: Callable[[list[Event]], bytes] | None = None,
        prelude: bytes = b"",
        merge_deltas: bool = True,
    ) -> None:
        self._response = response
        self.topic = self._topic = topic
        self._send_timeout = send_timeout
        self._bus = bus
        self._after_seq = after_seq
        self._is_finished = is_finished
        self._heartbeat = heartbeat
        self._stats = stats
        self._project = project
        self._encode = encode
        self._prelude = prelude
        self._journal = journal
        # Subscribed before the first journal read, so no event falls between the two.
        # merge_deltas=False: a full buffer always goes back to the journal, so the client's
        # frames can be numbered per journal event (never a merged delta).
        self._subscriber = bus.subscribe(topic, capacity, merge_deltas=merge_deltas)
        self._wakeup = self._subscriber.wakeup
        transport = self._transport = request.transport
        self._high_water = transport.get_write_buffer_limits()[1] if transport is not None else 0
        self._chunked = "chunked" in response.headers.get(hdrs.TRANSFER_ENCODING, "").lower()
        # Writing from `publish` bypasses the response's writer: only for plain (unprojected,
        # uncompressed) streams.
        self._can_write_directly = (
            project is None and encode is None and transport is not None and not response.compression
        )
        self._loop = asyncio.get_running_loop()
        self._beat = False  # a heartbeat period went by
        self._beat_handle: asyncio.TimerHandle | None = None
        self._last = after_seq  # the seq of the last event the client was sent
        self._replaying = True  # reading the journal page by page, until a page comes back short
        self._sent = False  # something was written (so the response headers are out)
        self._finished = False  # a direct write delivered the terminal event
        self._stopping = False  # shutdown: write what is buffered, then end
        self._protocol = request.protocol if isinstance(request.protocol, JsonErrorRequestHandler) else None
        if self._protocol is not None:  # the client left: end now, not at the next heartbeat
            self._protocol.on_connection_lost = self.stop

    def stop(self) -> None:
        """End the stream after writing what its buffer holds (the gateway is stopping)."""
        self._stopping = True
        self._wakeup.set()

    async def open(self) -> None:
        """Send the response headers and a comment now: aiohttp holds headers back until the first
        write, which on an idle stream is the first heartbeat."""
        async with asyncio.timeout(self._send_timeout):
            await self._response.write(OPENING_COMMENT + self._prelude)
        self._sent = True

    async def run(self) -> None:
        self._beat_handle = self._loop.call_later(self._heartbeat, self._on_beat)
        self._stats._opened(self)
        try:
            await self.open()
            while True:
                if self._stopping and (self._replaying or self._subscriber.needs_replay):
                    break  # behind the live tail: the client resumes from the journal
                if self._replaying or self._subscriber.needs_replay:
                    events = await self._replay_page()
                else:
                    events = await self._tail()
                if events is None:
                    break
                if events and await self._send(events):
                    break
        except ConnectionResetError:
            pass  # the client went away; it resumes with Last-Event-ID
        except TimeoutError:
            # The client stopped reading for the send timeout: drop it. A graceful close would
            # wait for it to drain what is queued, which it never does.
            if self._transport is not None:
                self._transport.abort()
        finally:
            self._close()
        try:
            self._response.stop_streaming()
            await self._response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass

    def _close(self) -> None:
        """Stop the heartbeat and leave the bus (counting this subscription's merges)."""
        if self._beat_handle is not None:
            self._beat_handle.cancel()
        if self._protocol is not None and self._protocol.on_connection_lost == self.stop:
            self._protocol.on_connection_lost = None
        self._stats.merges += self._subscriber.merges
        self._bus.unsubscribe(self._subscriber)
        self._stats._closed(self)

    def _on_beat(self) -> None:
        """One timer per stream (not one per wait), waking the writer to check the peer."""
        self._beat = True
        self._wakeup.set()
        self._beat_handle = self._loop.call_later(self._heartbeat, self._on_beat)

    async def _replay_page(self) -> list[Event] | None:
        """The next page from the journal after the last seq sent; None once a finished topic has
        nothing left. A full page means more may follow: the next step replays again."""
        subscriber = self._subscriber
        if subscriber.needs_replay:
            self._stats.replays += 1
        # Dropping the buffer and snapshotting the journal happen in one step.
        subscriber.needs_replay = False
        subscriber.buffer.clear()
        self._wakeup.clear()
        page = REPLAY_PAGE if self._last > self._after_seq else REPLAY_FIRST_PAGE
        events = await self._journal.read(self._topic, self._last, page)
        self._replaying = len(events) >= page
        if not events and not self._replaying and self._is_finished():
            return None
        return events

    async def _tail(self) -> list[Event] | None:
        """The next batch from the subscription's buffer, waiting for one if it is empty (then
        returns [] to go round again); None when the stream is over."""
        subscriber = self._subscriber
        if not subscriber.buffer:
            return None if self._stopping else await self._wait()
        taken = subscriber.take(WRITE_BATCH)
        if taken and taken[0].seq <= self._last:  # seqs increase: only a head can be stale
            events = [e for e in taken if e.seq > self._last]
            if not events and taken[-1].is_terminal:
                return None  # the client's cursor is already past the end of the run
            return events
        return taken

    async def _wait(self) -> list[Event] | None:
        """Wait for a publish or a heartbeat. Meanwhile `publish` may write to the socket directly;
        None if the client left or a direct write delivered the terminal event."""
        if self._beat:  # a heartbeat period went by with nothing to send
            self._beat = False
            self._wakeup.clear()
            # Ask the socket, not aiohttp-sse's ping task (whose end is not always a lost peer).
            transport = self._transport
            if transport is None or transport.is_closing():
                return None
        subscriber = self._subscriber
        if self._sent and self._can_write_directly:  # (headers are out: aiohttp sends them with the first write)
            subscriber.write_directly = self._write_directly
        await self._wakeup.wait()
        subscriber.write_directly = None
        return None if self._finished or (self._stopping and not subscriber.buffer) else []

    async def _send(self, events: list[Event]) -> bool:
        """Write `events` through the response; True if the last is the terminal event."""
        project, encode = self._project, self._encode
        if encode is not None:
            blob = encode(events)
        elif project is not None:
            blob = encode_events(events, project)
        else:
            blob = _shared_frames(self._bus, self._topic, events)
        transport = self._transport
        idle = transport is not None and not transport.get_write_buffer_size()
        if not blob:
            pass  # nothing the client sees (an encoder skipping what a resumed client has)
        elif self._sent and idle and len(blob) + 64 <= self._high_water:
            # Headers sent, nothing queued (so not paused) and the batch fits below the
            # high-water mark: the write cannot pause the transport, so it cannot wait for a
            # drain, and needs no send timer.
            await self._response.write(blob)
        else:
            async with asyncio.timeout(self._send_timeout):
                await self._response.write(blob)
        self._sent = True
        self._stats.delivered += len(events)
        last = events[-1]
        self._last = last.seq
        return last.is_terminal  # nothing follows a run's terminal event

    def _write_directly(self, events: list[Event], frames: bytes | None) -> bool:
        """Write a just-published batch to the socket from `publish`, while this client waits with
        nothing buffered: no task switch per client per batch. Declines (the batch is then
        buffered as usual) unless the transport's own buffer is empty, so at most one batch ever
        waits there and no drain or send timer is needed."""
        transport = self._transport
        assert transport is not None
        if events[0].seq <= self._last or transport.is_closing():
            return False
        if transport.get_write_buffer_size():
            return False  # the client is not keeping up: buffer (merge, replay) as usual
        blob = frames if frames is not None else encode_events(events)
        transport.write(b"%x\r\n%b\r\n" % (len(blob), blob) if self._chunked else blob)
        self._stats.delivered += len(events)
        last = events[-1]
        self._last = last.seq
        if last.is_terminal:  # nothing follows a run's terminal event
            self._finished = True
            self._subscriber.write_directly = None
            self._wakeup.set()
        return True


async def stream_run(
    request: web.Request,
    *,
    status: int = 200,
    topic: str,
    journal: Journal,
    bus: Bus,
    after_seq: int,
    is_finished: Callable[[], bool],
    capacity: int,
    heartbeat: float,
    stats: StreamStats,
    project: Callable[[Event], Any] | None = None,
    send_timeout: float = SEND_TIMEOUT,
    encode: Callable[[list[Event]], bytes] | None = None,
    prelude: bytes = b"",
    headers: Mapping[str, str] | None = None,
    merge_deltas: bool = True,
) -> web.StreamResponse:
    """Stream `topic` (a run id, or a workspace's topic) after `after_seq` until its terminal event.

    `is_finished()` tells whether the topic can have no later events (a finished run whose
    terminal event the client already has); `project` maps each event to what the client sees
    (None: the event's wire JSON); `encode`, when given, turns each batch into its SSE frames
    instead (a stateful encoder for another protocol: it sees every event once, in order), and
    `prelude` (complete frames) goes out as the stream opens. `status` and `headers` are the
    response's (create-and-stream answers 201 with the run's Location).
    A client that falls behind its buffer gets text deltas merged, or with `merge_deltas=False` is
    replayed from the journal instead (an encoder that numbers every journal event).
    A write that cannot go out within `send_timeout` seconds (the client stopped reading) ends the
    stream and drops the connection.
    """
    response = EventSourceResponse(
        status=status,
        headers=headers,
        allow_all_methods=True,  # a POST may answer with a stream (create-and-stream, other protocols)
        ping_interval=max(heartbeat, 0.1),
        send_timeout=send_timeout,
    )
    response.headers["X-Accel-Buffering"] = "no"
    await response.prepare(request)
    stream = RunStream(
        request,
        response,
        topic=topic,
        journal=journal,
        bus=bus,
        after_seq=after_seq,
        is_finished=is_finished,
        capacity=capacity,
        heartbeat=heartbeat,
        stats=stats,
        project=project,
        send_timeout=send_timeout,
        encode=encode,
        prelude=prelude,
        merge_deltas=merge_deltas,
    )
    await stream.run()
    return response
