"""The SSE writer: replay from the journal, then tail the bus, with no gap and no duplicate.

A client's events go out in batched writes of frames built by `models.sse_frames` (clients in step
with a run share one encoding of each batch). A client that falls behind its buffer is switched
back to replay from the journal. The response headers go out with a first comment as the stream
opens; a client that stops reading is cut off after the send timeout; at shutdown
(`StreamStats.stop_all`) every stream writes what it has buffered and ends.

An idle stream costs little (10,000 of them on one instance). Once its headers are out, its
connection leaves aiohttp (`server.http_server.hand_off`): aiohttp's request, parser and request tasks
are freed, and the stream goes on in one task of its own, writing HTTP/1.1 chunks to the
connection, which closes when the stream ends (the headers say `Connection: close`). No timer of
its own either: one heartbeat timer per period wakes every open stream; an idle one then checks
its socket and writes a ping comment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web

from agent_gateway.bus import Bus
from agent_gateway.journal import Journal, TailFrames
from agent_gateway.models import Event, Run, sse_frames
from agent_gateway.server.fairness import waiting_requests
from agent_gateway.server.http_server import HandedOffConnection, JsonErrorRequestHandler, can_hand_off, hand_off
from agent_gateway.storage import StorageUnavailable

log = logging.getLogger("agent_gateway.http")

REPLAY_PAGE = 2000
REPLAY_FIRST_PAGE = 200  # a resumed client sees its first events after a short read, not a full page
# A page is encoded and written this many events at a time, with a loop turn in between: 2,000
# frames built in one step would hold the loop for milliseconds.
SEND_SLICE = 512
WRITE_BATCH = 256
SEND_TIMEOUT = 60.0  # default of [gateway] stream_send_timeout_seconds
OPENING_COMMENT = b": stream open\n\n"
PING_COMMENT = b": ping\r\n\r\n"
_TCP_USER_TIMEOUT: int | None = getattr(socket, "TCP_USER_TIMEOUT", None)  # Linux only


class EventStreamResponse(web.StreamResponse):
    """A `text/event-stream` response with the headers proxies and browsers need. HTTP/1.1 bodies
    go out chunked (aiohttp's default for a body of unknown length). The kernel is asked to drop
    the connection when written data stays unacknowledged for the send timeout, so a vanished peer
    is found by the next write (a ping) even while the socket buffers still have room. Pings are
    written by `RunStream`'s heartbeat: this response starts no task of its own.

    The handler returns the response with its `stream` attached, unstarted; aiohttp then prepares
    it and calls `write_eof`, whose first call runs the stream. So an open stream holds no frame
    of the handler or the middleware (10,000 idle clients); once handed off from aiohttp, none of
    aiohttp's either."""

    # The headers go out with the stream's first write (`RunStream.open`, in the same loop step as
    # `prepare`), not alone: one send and one wake-up of the client instead of two.
    _send_headers_immediately = False

    def __init__(
        self, *, status: int = 200, headers: Mapping[str, str] | None = None, send_timeout: float = SEND_TIMEOUT
    ) -> None:
        super().__init__(status=status)
        if headers is not None:
            self.headers.extend(headers)
        self.headers[hdrs.CONTENT_TYPE] = "text/event-stream"
        self.headers[hdrs.CACHE_CONTROL] = "no-cache"
        self.headers[hdrs.CONNECTION] = "keep-alive"
        self.headers["X-Accel-Buffering"] = "no"  # nginx: pass each write on, do not buffer the stream
        self._send_timeout = send_timeout
        self._tcp_socket: socket.socket | None = None
        self._saved_user_timeout = 0
        self.stream: RunStream | None = None  # run by the first `write_eof`

    async def prepare(self, request: web.BaseRequest) -> Any:
        if not self.prepared:
            self._set_user_timeout(request)
        return await super().prepare(request)

    def write_eof(self, data: bytes = b"") -> Awaitable[None]:
        """The first call (aiohttp's, once the handler has returned and the response is prepared)
        runs the attached stream, which ends the body with a second call. Not a coroutine
        function: the stream's coroutine is returned as is, no frame of this method waits on it."""
        stream, self.stream = self.stream, None
        if stream is not None:
            return stream.run()
        return self._end(data)

    async def _end(self, data: bytes) -> None:
        await super().write_eof(data)
        sock = self._tcp_socket
        if sock is not None and _TCP_USER_TIMEOUT is not None and sock.fileno() >= 0:
            # The connection may serve further requests: give it back its own setting.
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, self._saved_user_timeout)
        self._tcp_socket = None

    def _set_user_timeout(self, request: web.BaseRequest) -> None:
        transport = request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if _TCP_USER_TIMEOUT is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        self._saved_user_timeout = sock.getsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_USER_TIMEOUT, int(self._send_timeout * 1000))
        self._tcp_socket = sock


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


class RunEnded:
    """`is_finished` for the stream of a run: whether the run has ended. A slotted object, not a
    lambda (a function and its closure cell: four times the size, one per open stream)."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        self.run = run

    def __call__(self) -> bool:
        return self.run.is_terminal


@dataclass(frozen=True)
class Streams:
    """What every SSE stream of a gateway reads from (its journal and bus) and how it is paced; the
    keyword arguments of :func:`stream_run` that are the same for every stream."""

    journal: Journal
    bus: Bus
    capacity: int
    heartbeat: float
    stats: StreamStats
    send_timeout: float

    def options(self) -> dict[str, Any]:
        return {
            "journal": self.journal,
            "bus": self.bus,
            "capacity": self.capacity,
            "heartbeat": self.heartbeat,
            "stats": self.stats,
            "send_timeout": self.send_timeout,
        }


class StreamStats:
    def __init__(self) -> None:
        self.delivered = 0
        self.replays = 0
        self.merges = 0
        self.open_streams = 0
        self._none_open: asyncio.Event | None = None
        # The open streams by heartbeat period (each in one group: no second set of them all, at
        # 10,000 idle clients), and per period the one timer that wakes them all (a timer per
        # stream is a TimerHandle and a heap entry per idle client).
        self._beating: dict[float, set[RunStream]] = {}
        self._beat_timers: dict[float, asyncio.TimerHandle] = {}

    def stop_all(self, keep: Callable[[str], bool] = lambda topic: False) -> None:
        """Ask every open stream whose topic `keep` does not want to end (after writing what it has
        buffered); its client resumes with Last-Event-ID."""
        for group in list(self._beating.values()):
            for stream in list(group):
                if not keep(stream.topic):
                    stream.stop()

    def abort_all(self) -> None:
        """Drop the connection of every open stream (the ones that did not end when asked: a
        client that stopped reading). A stream handed off from aiohttp is not aiohttp's to drop
        at shutdown any more."""
        for group in list(self._beating.values()):
            for stream in list(group):
                stream._abort()

    async def wait_closed(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every open stream to end; whether they all did."""
        if not self.open_streams:
            return True
        self._none_open = self._none_open or asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._none_open.wait()
        return not self.open_streams

    def _opened(self, stream: RunStream) -> None:
        self.open_streams += 1
        if self._none_open is not None:
            self._none_open.clear()
        period = stream.heartbeat
        group = self._beating.get(period)
        if group is None:
            group = self._beating[period] = set()
            self._beat_timers[period] = asyncio.get_running_loop().call_later(period, self._beat, period)
        group.add(stream)

    def _closed(self, stream: RunStream) -> None:
        self.open_streams -= 1
        if not self.open_streams and self._none_open is not None:
            self._none_open.set()
        period = stream.heartbeat
        group = self._beating.get(period)
        if group is not None:
            group.discard(stream)
            if not group:
                del self._beating[period]
                self._beat_timers.pop(period).cancel()

    def _beat(self, period: float) -> None:
        """A heartbeat period went by: wake every open stream with that period. A stream opened
        just before hears its first beat early, which only means an early ping."""
        group = self._beating.get(period)
        if not group:
            return
        for stream in group:
            stream.beat()
        self._beat_timers[period] = asyncio.get_running_loop().call_later(period, self._beat, period)


class RunStream:
    """One client's stream of a topic on a prepared response: pages of replay from the journal,
    then the live tail of its bus subscription, until the topic's terminal event or the client
    leaves.

    Each step of `run` gets the next batch (`_replay_page`, or `_take` from the buffer once replay
    caught up, waiting when it is empty) and `_send`s it. While the writer waits with nothing
    buffered, `publish` may write a batch straight to the socket (`_write_directly`). The
    heartbeat (`StreamStats`' shared timer) wakes the writer to check that the peer is still there
    and to write a ping comment."""

    # Slots: one instance per open stream, so per-instance dicts add up (10,000 idle clients).
    __slots__ = (
        "_after_seq",
        "_beat",
        "_bus",
        "_can_write_directly",
        "_capacity",
        "_chunked",
        "_connection",
        "_encode",
        "_finished",
        "_high_water",
        "_is_finished",
        "_journal",
        "_last",
        "_merge_deltas",
        "_prelude",
        "_project",
        "_protocol",
        "_replaying",
        "_request",
        "_response",
        "_send_timeout",
        "_sent",
        "_stats",
        "_stopping",
        "_subscriber",
        "_task",
        "_topic",
        "_transport",
        "_unanswered",
        "_wakeup",
        "heartbeat",
        "topic",
    )

    def __init__(
        self,
        request: web.Request,
        response: web.StreamResponse,
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
        self._response: web.StreamResponse | None = response
        self.topic = self._topic = topic
        self._send_timeout = send_timeout
        self._bus = bus
        self._after_seq = after_seq
        self._is_finished = is_finished
        self.heartbeat = heartbeat
        self._stats = stats
        self._project = project
        self._encode = encode
        self._prelude = prelude
        self._journal = journal
        self._capacity = capacity
        self._merge_deltas = merge_deltas
        transport = self._transport = request.transport
        self._high_water = transport.get_write_buffer_limits()[1] if transport is not None else 0
        self._chunked = False  # known once the response is prepared
        # Writing from `publish` bypasses the response's writer: only for uncompressed streams
        # that are unprojected (an encoder, which sees each event once either way, may write).
        self._can_write_directly = project is None and transport is not None and not response.compression
        self._beat = False  # a heartbeat period went by
        self._last = after_seq  # the seq of the last event the client was sent
        self._replaying = True  # reading the journal page by page, until a page comes back short
        self._sent = False  # something was written (so the response headers are out)
        self._finished = False  # a direct write delivered the terminal event
        self._stopping = False  # shutdown: write what is buffered, then end
        self._protocol = request.protocol if isinstance(request.protocol, JsonErrorRequestHandler) else None
        # The request's connection until the stream's first events are written: until then it is
        # a request waiting for its answer, which runtimes' slices give way to (`fairness`).
        self._unanswered: object | None = request.protocol
        # Once the headers are out, the connection leaves aiohttp (`hand_off`) unless the
        # response needs aiohttp's writer (compression).
        self._request: web.Request | None = request if not response.compression and can_hand_off(request) else None
        if self._request is not None:  # the connection ends with the stream: say so
            response.headers.popall(hdrs.CONNECTION, None)
            response.force_close()
        self._connection: HandedOffConnection | None = None
        self._task: asyncio.Task[None] | None = None

    def stop(self) -> None:
        """End the stream after writing what its buffer holds (the gateway is stopping)."""
        self._stopping = True
        self._wakeup.set()

    async def open(self) -> None:
        """Send the response headers and a comment now: aiohttp holds headers back until the first
        write, which on an idle stream is the first heartbeat. The events the journal's tail
        already holds go in the same write (a new run's `run.created`): the first event leaves
        with the headers, not a loop turn later."""
        assert self._response is not None
        first = self._first_frames()
        async with asyncio.timeout(self._send_timeout):
            await self._response.write(OPENING_COMMENT + self._prelude + (first.frames if first else b""))
        if first is not None:
            self._stats.delivered += first.count
            self._last = first.last_seq
            self._replaying = first.count >= REPLAY_FIRST_PAGE or not first.caught_up
            if self._unanswered is not None:
                self._answered()
        self._sent = True

    def beat(self) -> None:
        """A heartbeat period went by: wake the writer to check the peer (and ping it if idle)."""
        self._beat = True
        self._wakeup.set()

    async def run(self) -> None:
        """Stream on the prepared response, and end it (called by its first `write_eof`). Nothing
        is held in the bus or the stats before this starts: a response aiohttp never gets to
        (the client left while it was prepared) leaves nothing behind. Once the headers are out
        the connection is handed off from aiohttp where it can be (`server.http_server.hand_off`): this
        returns, aiohttp's request task ends, and the stream goes on in a task of its own."""
        # Subscribed before the first journal read, so no event falls between the two.
        # merge_deltas=False: a full buffer always goes back to the journal, so the client's
        # frames can be numbered per journal event (never a merged delta).
        self._subscriber = self._bus.subscribe(self._topic, self._capacity, merge_deltas=self._merge_deltas)
        self._wakeup = self._subscriber.wakeup
        if self._protocol is not None:  # the client left: end now, not at the next heartbeat
            self._protocol.on_connection_lost = self.stop
        assert self._response is not None
        self._chunked = "chunked" in self._response.headers.get(hdrs.TRANSFER_ENCODING, "").lower()
        self._stats._opened(self)
        await self._serve(opening=True)

    async def _serve(self, *, opening: bool) -> None:
        handed_off = False
        try:
            if opening:
                await self.open()
                handed_off = self._hand_off()
            if not handed_off:
                await self._pump()
        except ConnectionResetError:
            pass  # the client went away; it resumes with Last-Event-ID
        except TimeoutError:
            # The client stopped reading for the send timeout: drop it. A graceful close would
            # wait for it to drain what is queued, which it never does.
            self._abort()
        # The handler has returned: no middleware turns these into a JSON error any more, and
        # the headers are out anyway. Log as the middleware would and drop the connection (the
        # client resumes with Last-Event-ID).
        except StorageUnavailable as exc:  # one line per stream, not a traceback
            log.warning("storage unavailable on the stream of %s: %s", self.topic, exc)
            self._abort()
        except Exception:
            log.exception("unhandled error on the stream of %s", self.topic)
            self._abort()
        finally:
            if not handed_off:
                self._close()
        if handed_off:
            # aiohttp's request task ends when this returns; the stream goes on here.
            self._task = asyncio.get_running_loop().create_task(self._serve(opening=False))
            return
        await self._end()

    def _hand_off(self) -> bool:
        """Take the connection from aiohttp (its headers are out); whether it was."""
        request, self._request = self._request, None
        if request is None:
            return False
        self._connection = hand_off(request, self.stop)
        if self._connection is None:
            return False
        if self._protocol is not None:
            self._protocol.on_connection_lost = None
            self._protocol = None
        self._response = None  # nothing more goes through aiohttp's writer
        return True

    async def _pump(self) -> None:
        """Send batches (replayed pages, then the live tail) until the stream is over."""
        subscriber = self._subscriber
        while True:
            if self._replaying or subscriber.needs_replay:
                if self._stopping:
                    break  # behind the live tail: the client resumes from the journal
                events = await self._replay_page()
            elif subscriber.buffer:
                events = self._take()
            elif self._stopping or not await self._idle():
                break
            else:
                # Waited here, not in a further helper coroutine: an idle stream's chain of
                # frames is one of the larger things it holds.
                await self._wakeup.wait()
                subscriber.write_directly = None
                if self._finished or (self._stopping and not subscriber.buffer):
                    break  # a direct write delivered the terminal event, or the gateway stops
                continue
            if events is None:
                break
            if isinstance(events, TailFrames):
                ended = await self._send_frames(events)
            else:
                ended = bool(events) and await self._send_sliced(events)
            events = None  # an idle stream must not hold its last batch (and their frames) while it waits
            if ended:
                break

    async def _write(self, data: bytes) -> None:
        """Write body bytes: through aiohttp's response, or once handed off, as an HTTP/1.1
        chunk on the connection, waiting while the peer's buffer is over its high-water mark."""
        connection = self._connection
        if connection is None:
            assert self._response is not None
            await self._response.write(data)
            return
        if connection.lost:
            raise ConnectionResetError("the client closed the connection")
        if not data:
            return  # an empty chunk would end the body
        connection.transport.write(self._framed(data))
        await connection.drain()

    def _framed(self, data: bytes) -> bytes:
        """`data` as written to the socket itself: one HTTP/1.1 chunk of a chunked body."""
        return b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data

    async def _end(self) -> None:
        """End the body: aiohttp's `write_eof`, or on a handed-off connection the last chunk,
        then close it (the response said `Connection: close`)."""
        connection = self._connection
        if connection is None:
            assert self._response is not None
            try:
                await self._response.write_eof()
            except (ConnectionResetError, RuntimeError):
                pass
            return
        transport = connection.transport
        if not connection.lost and not transport.is_closing():
            if self._chunked:
                transport.write(b"0\r\n\r\n")
            transport.close()
        self._task = None

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _close(self) -> None:
        """Leave the heartbeat and the bus (counting this subscription's merges)."""
        self._leave()
        self._stats.merges += self._subscriber.merges
        self._stats._closed(self)

    def _leave(self) -> None:
        if self._protocol is not None and self._protocol.on_connection_lost == self.stop:
            self._protocol.on_connection_lost = None
        self._bus.unsubscribe(self._subscriber)

    async def _replay_page(self) -> list[Event] | TailFrames | None:
        """The next page from the journal after the last seq sent; None once a finished topic has
        nothing left. A full page means more may follow: the next step replays again."""
        subscriber = self._subscriber
        if subscriber.needs_replay:
            self._stats.replays += 1
        # Dropping the buffer and snapshotting the journal happen in one step.
        subscriber.needs_replay = False
        subscriber.clear()
        self._wakeup.clear()
        page = REPLAY_PAGE if self._last > self._after_seq else REPLAY_FIRST_PAGE
        if self._project is None and self._encode is None:  # the journal's own frames will do
            frames = self._journal.read_frames(self._topic, self._last, page)
            if frames is not None:
                # A running run's events as sent before: no storage read, no encoding. Unless
                # they reach the last published event, what follows is read next.
                self._replaying = frames.count >= page or not frames.caught_up
                return frames
        # Whether the run had ended before the read: its terminal event is published before its
        # status flips, so such a read holds it. A run that ends during the read (a worker trip)
        # may have published it after the read's snapshot, into the buffer, which delivers it next.
        finished = self._is_finished()
        events = await self._journal.read(self._topic, self._last, page)
        self._replaying = len(events) >= page
        if not events and not self._replaying and finished:
            return None
        return events

    def _take(self) -> list[Event] | None:
        """The next batch from the subscription's (non-empty) buffer; None when the stream is
        over."""
        taken = self._subscriber.take(WRITE_BATCH)
        if taken and taken[0].seq <= self._last:  # seqs increase: only a head can be stale
            events = [e for e in taken if e.seq > self._last]
            if not events and taken[-1].is_terminal:
                return None  # the client's cursor is already past the end of the run
            return events
        return taken

    async def _idle(self) -> bool:
        """Before the writer waits for a publish or a heartbeat with nothing buffered: after a
        heartbeat, check the peer and ping it. False if the client left. Then, while the writer
        waits, `publish` may write to the socket directly."""
        if self._beat:  # a heartbeat period went by with nothing to send
            self._beat = False
            self._wakeup.clear()
            transport = self._transport
            if transport is None or transport.is_closing():
                return False
            # A comment keeps proxies from timing the connection out, and a write to a vanished
            # peer fails within the send timeout (TCP_USER_TIMEOUT), ending the stream.
            async with asyncio.timeout(self._send_timeout):
                await self._write(PING_COMMENT)
        if self._sent and self._can_write_directly:  # (headers are out: aiohttp sends them with the first write)
            self._subscriber.write_directly = self._write_directly
        return True

    def _first_frames(self) -> TailFrames | None:
        """The frames of the events after the client's cursor that the run's tail in memory holds
        (a first page, read in the step that subscribed, so none falls between); None when the
        tail does not hold them, for a projected or encoded stream, or when they end the run
        (the stream's pump sends those and ends)."""
        if self._project is not None or self._encode is not None:
            return None
        frames = self._journal.read_frames(self._topic, self._last, REPLAY_FIRST_PAGE)
        if frames is None or frames.terminal or not frames.count:
            return None
        return frames

    def _answered(self) -> None:
        """The first events are out: the request no longer waits for its answer."""
        waiting_requests().answered(self._unanswered)
        self._unanswered = None

    async def _send_frames(self, tail: TailFrames) -> bool:
        """Write frames from the journal's tail as they are; True if the last is the terminal event."""
        async with asyncio.timeout(self._send_timeout):
            await self._write(tail.frames)
        self._sent = True
        self._stats.delivered += tail.count
        if self._unanswered is not None:
            self._answered()
        self._last = tail.last_seq
        return tail.terminal

    async def _send_sliced(self, events: list[Event]) -> bool:
        """`_send` SEND_SLICE events at a time; True if the last is the terminal event."""
        if len(events) <= SEND_SLICE:
            return await self._send(events)
        for start in range(0, len(events), SEND_SLICE):
            if start:
                await asyncio.sleep(0)  # a loop turn for everyone else
            if await self._send(events[start : start + SEND_SLICE]):
                return True
        return False

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
            await self._write(blob)
        else:
            async with asyncio.timeout(self._send_timeout):
                await self._write(blob)
        self._sent = True
        self._stats.delivered += len(events)
        if self._unanswered is not None:
            self._answered()
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
        encode = self._encode
        if encode is None:
            blob = frames if frames is not None else encode_events(events)
        else:
            try:
                blob = encode(events)
            except Exception:
                # The encoder has seen part of the batch: buffering it would encode that part
                # twice. End the stream as the writer does on an encoder error.
                log.exception("unhandled error on the stream of %s", self.topic)
                self._abort()
                self._finished = True
                self._subscriber.write_directly = None
                self._wakeup.set()
                return True
        if blob:  # (an encoder may have nothing to send; an empty chunk would end the body)
            transport.write(self._framed(blob))
        self._stats.delivered += len(events)
        if self._unanswered is not None:
            self._answered()
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

    Returns the response, unprepared, for the handler to return (`return await stream_run(...)`):
    aiohttp prepares it and calls its `write_eof`, which runs the stream. So nothing of the
    handler or of the middleware stays alive while the stream waits (10,000 idle clients).
    """
    # Any method may answer with a stream (a POST for create-and-stream and other protocols).
    response = EventStreamResponse(status=status, headers=headers, send_timeout=send_timeout)
    response.stream = RunStream(
        request,
        response,
        topic=topic,
        journal=journal,
        bus=bus,
        after_seq=after_seq,
        is_finished=is_finished,
        capacity=capacity,
        heartbeat=max(heartbeat, 0.1),
        stats=stats,
        project=project,
        send_timeout=send_timeout,
        encode=encode,
        prelude=prelude,
        merge_deltas=merge_deltas,
    )
    return response
