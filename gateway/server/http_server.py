"""The HTTP server the launcher runs: aiohttp's, with errors from its own parser in the gateway's
JSON shape, and connection hygiene.

A malformed request (a 100 KB path, an over-long header line, a bad method) never reaches the
application's middlewares: aiohttp's protocol handler answers it itself, as ``text/plain``. The
request handler here answers ``{"error": {"code", "message"}}`` instead, so every refusal a
client can get is JSON.

Connections are bounded (`ConnectionLimits`): a request's headers must arrive within
``header_timeout`` of the connection opening or of their first byte (a client trickling a header
line every few seconds is dropped), an idle keep-alive connection closes after ``idle_timeout``,
and beyond ``max_connections`` open connections a new one is answered 503 and closed.
A long, write-only response (an SSE stream) can take its connection from aiohttp once its
headers are out (`hand_off`), so an idle stream holds none of aiohttp's per-connection state; such
connections still count against ``max_connections``.
`GuardedTCPSite` accepts connections with its own loop: out of file descriptors, it backs off and
logs once per interval (asyncio's own accept loop logs one line per attempt and re-arms itself
once per failure, which at the fd limit grows into hundreds of thousands of lines a second).
A burst of connections is spread over loop turns, so that the loop keeps turning (and a health
probe keeps being answered) while 500 clients arrive at once: the accept loop takes at most
``ACCEPT_BATCH`` connections per turn, and at most ``STREAM_OPENINGS_PER_TURN`` requests asking
for an event stream are parsed and handled per turn (`StreamOpenings`), the rest in arrival order:
their bytes wait unparsed, reading paused, until their turn.
Before accepting, the site grows the process's descriptor table to hold ``max_connections`` and
as many more (`reserve_descriptors`): Linux grows it while a socket is made, and in a process with
threads each growth waits for an RCU grace period with the loop blocked (10-25 ms here, several
times during a 500-client burst, the loop off its CPU).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import fcntl
import logging
import os
import resource
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import aiohttp
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from agent_gateway.errors import error_response
from agent_gateway.server.fairness import waiting_requests

log = logging.getLogger("agent_gateway.http")

# Connections the kernel holds for `accept` (capped by net.core.somaxconn). aiohttp's 128 overflows
# in a burst of 500 clients: the rest see their handshake dropped and retry after a second, then
# send their requests all at once.
LISTEN_BACKLOG = 1024
# Event streams whose handling starts per loop turn, at most (`StreamOpenings`). With ACCEPT_BATCH,
# 4 rather than 8 halved the longest turn of a 500-client burst (about 2.5 ms of CPU instead of
# 4-5) for about a tenth more time to open them all: a health probe waits a few turns.
STREAM_OPENINGS_PER_TURN = 4

# accept() failing for want of resources: wait and retry (the waiting clients stay in the backlog).
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_BACKOFF_FIRST = 0.05
ACCEPT_BACKOFF_MAX = 1.0
ACCEPT_ERROR_LOG_INTERVAL = 10.0
# Connections accepted per loop turn, at most. `sock_accept` returns without yielding while the
# backlog holds connections, so a burst (500 streams at once) was accepted in one turn, and each
# later step of their setup (transport, request parse, handler, headers) then ran for all of them
# in one turn too: a 100-400 ms stall. A turn in between every few accepts spreads the burst over
# many short turns; the rest waits in the kernel's backlog.
ACCEPT_BATCH = 4

# Descriptors reserved per connection allowed (`reserve_descriptors`): the client's, and one more
# for what a run opens on its behalf (an upstream connection, an agent's pipes), plus a margin for
# the rest (storage files, the spool, listening sockets).
DESCRIPTORS_PER_CONNECTION = 2
DESCRIPTORS_MARGIN = 256

# aiohttp's internals this module reads, sets or overrides: there is no public way to do what it
# does with them. setup.cfg pins aiohttp to AIOHTTP_TESTED, the series they were checked on;
# tests/test_aiohttp_internals.py checks each on the installed aiohttp, and `GatewayRunner`
# refuses to start on one that lacks any (`missing_aiohttp_internals`).
AIOHTTP_TESTED = ">=3.14,<3.15"
AIOHTTP_INTERNALS: tuple[tuple[type, tuple[str, ...]], ...] = (
    # the per-connection protocol: its server, request queue and state, the handler a request
    # goes to (replaced beyond max_connections), flow control; two methods overridden here
    (
        RequestHandler,
        (
            "_manager",
            "_messages",
            "_request_in_progress",
            "_waiter",
            "_request_handler",
            "_loop",
            "_paused",
            "_reading_paused",
            "_buffer_paused",
            "finish_response",
            "handle_error",
        ),
    ),
    (web.Server, ("_loop", "_kwargs", "request_handler")),  # what a request handler is made with, calls
    # an event stream's headers wait for its first write (`agent_gateway.sse.EventStreamResponse`)
    (web.StreamResponse, ("_send_headers_immediately",)),
    (web.BaseRunner, ("_make_server",)),  # overridden: our server class
    (web.BaseSite, ("_runner", "_ssl_context", "_backlog", "_server")),  # `GuardedTCPSite`
)


def missing_aiohttp_internals(*objects: object) -> list[str]:
    """What the installed aiohttp lacks of `AIOHTTP_INTERNALS`, one sentence each. Each name is
    looked up on the first of `objects` that is an instance of its class (attributes set in
    ``__init__``), else on the class (slots, methods)."""
    missing: list[str] = []
    for cls, names in AIOHTTP_INTERNALS:
        where = next((obj for obj in objects if isinstance(obj, cls)), cls)
        missing += [
            f"aiohttp {aiohttp.__version__} has no {cls.__name__}.{name}, which {__name__} relies on: use "
            f"aiohttp{AIOHTTP_TESTED} (setup.cfg's pin, the range it was tested with); the pin must stay "
            f"below {aiohttp.__version__} until {__name__} is adapted"
            for name in names
            if not hasattr(where, name)
        ]
    return missing


@dataclass(frozen=True)
class ConnectionLimits:
    """``[gateway]`` header_timeout_seconds, idle_timeout_seconds, max_connections."""

    header_timeout: float = 10.0
    idle_timeout: float = 75.0
    max_connections: int = 1000

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> ConnectionLimits:
        return cls(
            header_timeout=float(section["header_timeout_seconds"]),
            idle_timeout=float(section["idle_timeout_seconds"]),
            max_connections=int(section["max_connections"]),
        )


class StreamOpenings:
    """Spreads a burst of event-stream requests over loop turns: at most `per_turn` start their
    handling in one turn, the others wait in arrival order. Opening a stream (the route, the
    response headers, the first write, the hand-off) costs a few hundred microseconds; 500 clients
    whose requests arrive together otherwise open in one turn and hold the loop for 100-400 ms,
    and every other request (a health probe) waits that long. Other requests never wait here:
    they go ahead of the streams still waiting.

    A connection whose bytes name `text/event-stream` is counted when they arrive
    (`JsonErrorRequestHandler.data_received`): beyond the turn's openings they wait unparsed
    (`later`), so parsing them, aiohttp's task per request and the route all come a few per turn;
    a request whose head did not show it in one read waits in its handler (`wait_turn`)."""

    def __init__(self, per_turn: int = STREAM_OPENINGS_PER_TURN) -> None:
        self.per_turn = per_turn
        self._started = 0  # in the current turn
        # Waiting streams, oldest first: a handler's future, or a connection's held request bytes
        # (`later`: a callback feeding them to the parser, False if the connection is gone).
        self._waiting: collections.deque[asyncio.Future[None] | Callable[[], bool]] = collections.deque()
        self._armed = False  # a call at the next turn is scheduled

    def may_start(self) -> bool:
        """Whether a stream may start now (counted if so): none waiting and room in this turn."""
        if self._waiting or self._started >= self.per_turn:
            return False
        self._started += 1
        self._arm()
        return True

    async def wait_turn(self) -> None:
        """Wait until a later turn lets this stream start (after the ones waiting before it)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._arm()
        await waiter

    def later(self, start: Callable[[], bool]) -> None:
        """Call `start` in a later turn (after the streams waiting before it), as one opening."""
        self._waiting.append(start)
        self._arm()

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._armed = False
        self._started = 0
        while self._waiting and self._started < self.per_turn:
            waiter = self._waiting.popleft()
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():  # (cancelled: its request is gone)
                    waiter.set_result(None)
                    self._started += 1
            elif waiter():
                self._started += 1
        if self._waiting or self._started:
            self._arm()


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering parser errors as JSON, with a header deadline
    and the connection cap."""

    _limits = ConnectionLimits()
    _header_deadline: asyncio.TimerHandle | None = None
    _over_capacity = False
    _watched_fd: int | None = None
    # The server's `StreamOpenings` (set by `JsonErrorServer`); an event-stream request's bytes held
    # until a later turn's opening; whether the request being parsed took this turn's opening.
    _stream_openings: StreamOpenings | None = None
    _held: bytearray | None = None
    _admitted = False
    # Called when the client disconnects: a stream sets it to end at once, instead of at its next
    # heartbeat (so its connection stops counting against max_connections).
    on_connection_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        manager = self._manager
        open_before = len(manager.connections) + getattr(manager, "handed_off", 0) if manager is not None else 0
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            waiting_requests().moved(sock.fileno(), self)
            self._watched_fd = sock.fileno()  # its next request ends a runtime's slice at once
            waiting_requests().watch(self._watched_fd)
        if open_before >= self._limits.max_connections:
            # Read the request (so the client sees the answer, not a reset), answer 503, close.
            self._over_capacity = True
            self._request_handler = self._answer_over_capacity
        self._start_header_deadline()  # a connection that never sends a request is dropped too

    def data_received(self, data: bytes) -> None:
        held = self._held
        if held is not None:  # (reading is paused: what was already read)
            held += data
            return
        if self._header_deadline is None and not self._request_in_progress and not self._messages:
            self._start_header_deadline()  # the first byte of the next request
            waiting_requests().arrived(self)  # runtimes hold back their slices until it is answered
        openings = self._stream_openings
        if (
            openings is not None
            and b"text/event-stream" in data
            and not self._request_in_progress
            and not self._messages
        ):
            # An event-stream request: it counts against this turn's openings from its parse on,
            # not from its handler two turns later. Streams whose requests arrive together (a
            # burst of clients) are then parsed, dispatched and opened a few per turn, and a
            # request arriving meanwhile (a health probe) waits for short turns only.
            if not openings.may_start():
                self._hold(openings, data)
                return
            self._admitted = True
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages or self._request_in_progress or (self._waiter is not None and self._waiter.done()):
            self._cancel_header_deadline()  # a whole request head arrived

    def _hold(self, openings: StreamOpenings, data: bytes) -> None:
        """Keep an event-stream request's bytes until a later turn's opening (`StreamOpenings`);
        reading pauses meanwhile, so a held request (and any body) holds what was read only."""
        self._held = bytearray(data)
        if b"\r\n\r\n" in data:
            self._cancel_header_deadline()  # its head is here: the wait is the gateway's, not the client's
        transport = self.transport
        if transport is not None:
            transport.pause_reading()  # type: ignore[attr-defined]
        openings.later(self._release)

    def _release(self) -> bool:
        """Its turn: feed the held bytes to the parser (as one of the turn's openings); False if
        the connection is gone."""
        held, self._held = self._held, None
        transport = self.transport
        if held is None or transport is None or transport.is_closing():
            return False
        self._admitted = True
        self._feed(bytes(held))
        if not (self._reading_paused or self._buffer_paused):  # (aiohttp's flow control may hold it now)
            transport.resume_reading()  # type: ignore[attr-defined]
        return True

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            waiting_requests().answered(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        waiting_requests().answered(self)
        if self._watched_fd is not None:
            waiting_requests().unwatch(self._watched_fd)
            self._watched_fd = None
        self._cancel_header_deadline()
        super().connection_lost(exc)
        callback, self.on_connection_lost = self.on_connection_lost, None
        if callback is not None:
            callback()

    def _start_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_deadline = self._loop.call_later(self._limits.header_timeout, self._on_header_deadline)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _on_header_deadline(self) -> None:
        self._header_deadline = None
        if not self._request_in_progress and not self._messages:
            self.force_close()  # headers incomplete (or never started) after header_timeout

    async def _answer_over_capacity(self, request: BaseRequest) -> web.StreamResponse:
        limit = self._limits.max_connections
        response = error_response(
            503, "too_many_connections", f"the gateway has {limit} open connections (its limit); retry shortly"
        )
        response.headers["Retry-After"] = "1"
        response.force_close()
        return response

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        text = super().handle_error(request, status, exc, message)  # logs, checks nothing was sent
        del text
        if status >= 500:
            response = error_response(status, "internal_error", "internal error; see the gateway log")
        else:
            reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "bad request"
            detail = (message or reason).splitlines()[0][:200] if (message or reason) else reason
            response = error_response(status, "bad_http_request", f"malformed HTTP request: {detail}")
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    limits = ConnectionLimits()
    handed_off = 0  # open connections taken from aiohttp by `hand_off` (they count against the cap)
    _stream_openings: StreamOpenings | None = None
    _handle_in_turn_bound: Callable[[BaseRequest], Awaitable[web.StreamResponse]] | None = None

    @property
    def stream_openings(self) -> StreamOpenings:
        if self._stream_openings is None:
            self._stream_openings = StreamOpenings()
        return self._stream_openings

    def __call__(self) -> RequestHandler:
        handler = JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)
        handler._limits = self.limits
        if self._handle_in_turn_bound is None:
            self._handle_in_turn_bound = self.handle_in_turn  # one bound method for every connection
        handler._request_handler = self._handle_in_turn_bound
        handler._stream_openings = self.stream_openings
        return handler

    def handle_in_turn(self, request: BaseRequest) -> Awaitable[web.StreamResponse]:
        """The application's handler, called at once, except for an event stream beyond this
        loop turn's openings (`StreamOpenings`). A plain function: most requests get no
        coroutine frame of their own here."""
        protocol = request.protocol
        if isinstance(protocol, JsonErrorRequestHandler) and protocol._admitted:
            protocol._admitted = False  # its opening was counted when its bytes were parsed
            return self.request_handler(request)
        if "text/event-stream" not in request.headers.get(hdrs.ACCEPT, "") or self.stream_openings.may_start():
            return self.request_handler(request)
        return self._handle_later(request)

    async def _handle_later(self, request: BaseRequest) -> web.StreamResponse:
        await self.stream_openings.wait_turn()
        return await self.request_handler(request)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser errors as JSON, within `limits`.

    ``shutdown_timeout`` (how long aiohttp waits for a request handler at shutdown, twice: before
    cancelling it and after) defaults short here: the gateway ends its streams itself before
    cleanup (`Gateway.drain`), so a handler still running then is stuck."""

    def __init__(
        self,
        app: web.Application,
        *,
        limits: ConnectionLimits | None = None,
        shutdown_timeout: float = 1.0,
        **kwargs: Any,
    ) -> None:
        self.limits = limits or ConnectionLimits()
        # aiohttp's keep-alive timer: an idle connection (between requests) closes after this.
        kwargs.setdefault("keepalive_timeout", self.limits.idle_timeout)
        super().__init__(app, shutdown_timeout=shutdown_timeout, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = JsonErrorServer  # same state, our request handler per connection
        server.limits = self.limits
        missing = missing_aiohttp_internals(server, self)  # the handler's are slots: on its class
        if missing:
            raise RuntimeError("; ".join(missing))
        return server


class HandedOffConnection(asyncio.Protocol):
    """A connection taken from aiohttp once a streaming response's headers are out (`hand_off`).
    It keeps what a long, write-only response still needs (writes, waiting for a slow peer to
    drain, hearing that the peer left) and none of aiohttp's per-connection state: the parsed
    request, the parser, the request handler and its two tasks, most of an idle stream's memory.
    The response ends with the connection: `close` after the body's last bytes."""

    __slots__ = ("_drained", "_on_lost", "_paused", "_server", "lost", "transport")

    def __init__(
        self, transport: asyncio.Transport, on_lost: Callable[[], None] | None, server: JsonErrorServer | None
    ) -> None:
        self.transport = transport
        self.lost = False
        self._on_lost = on_lost
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._server = server
        if server is not None:
            server.handed_off += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if self._server is not None:
            self._server.handed_off -= 1
            self._server = None
        self._wake(ConnectionResetError("the client closed the connection"))
        callback, self._on_lost = self._on_lost, None
        if callback is not None:
            callback()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake(None)

    def data_received(self, data: bytes) -> None:
        """Ignored: the client of a stream has nothing more to say (a pipelined request after a
        stream is not served; the connection closes when the stream ends)."""

    async def drain(self) -> None:
        """Return once the transport's buffer is below its high-water mark; ConnectionResetError
        if the peer left."""
        if self.lost:
            raise ConnectionResetError("the client closed the connection")
        if self._paused:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def _wake(self, exc: BaseException | None) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)


def can_hand_off(request: BaseRequest) -> bool:
    """Whether `hand_off` can take the connection of `request` (an HTTP/1.1 connection of
    aiohttp's with no further request buffered behind this one)."""
    handler, transport = request.protocol, request.transport
    return (
        isinstance(handler, RequestHandler)
        and isinstance(transport, asyncio.Transport)
        and hasattr(transport, "set_protocol")
        and request.version >= (1, 1)
        and not getattr(handler, "_messages", None)  # pipelined requests would go unanswered
    )


def hand_off(request: BaseRequest, on_lost: Callable[[], None] | None = None) -> HandedOffConnection | None:
    """Take the connection of `request` from aiohttp, whose response headers are written: the
    transport is given a `HandedOffConnection`, and aiohttp's request handler lets go of it
    without closing it, so that its request task ends (once the handler returns) and its parser,
    request and tasks are freed. `on_lost` runs when the peer goes. None when the connection
    cannot be handed off (`can_hand_off`) or is closing: the response stays with aiohttp."""
    handler, transport = request.protocol, request.transport
    if not can_hand_off(request) or transport is None or transport.is_closing():
        return None
    assert isinstance(handler, RequestHandler) and isinstance(transport, asyncio.Transport)
    manager = handler._manager
    if isinstance(handler, JsonErrorRequestHandler):
        handler.on_connection_lost = None
    connection = HandedOffConnection(transport, on_lost, manager if isinstance(manager, JsonErrorServer) else None)
    connection._paused = bool(getattr(handler, "_paused", False))
    transport.set_protocol(connection)
    # aiohttp's handler believes the peer left: it drops its parser and request, its task ends
    # with the response, and its server forgets the connection (counted in `handed_off` now).
    handler.transport = None
    handler.connection_lost(None)
    if not transport.is_reading():
        transport.resume_reading()  # to hear the peer leave
    return connection


class _RateLimitedLog:
    """One warning per interval, counting the ones it held back."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = -interval
        self._held_back = 0

    def warning(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            self._held_back += 1
            return
        held_back, self._held_back, self._last = self._held_back, 0, now
        suffix = f" ({held_back} more since the last message)" if held_back else ""
        log.warning(message + suffix, *args)


class _Listening:
    """What aiohttp reads of a site's server: its sockets (for ``runner.addresses``), and close."""

    def __init__(self, sockets: list[socket.socket], close: Callable[[], None]) -> None:
        self.sockets = sockets
        self.close = close


def _listening_sockets(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for every address of `host` (all interfaces for an
    empty host), like ``loop.create_server``; with port 0, one port for every address."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def reserve_descriptors(count: int, source: int) -> int:
    """Grow this process's descriptor table to hold `count` descriptors (capped by the soft
    RLIMIT_NOFILE) now, while nothing waits on the loop. Linux grows the table in powers of two
    as descriptors are made and never shrinks it; in a process with threads each growth waits for
    an RCU grace period in the thread making the descriptor: the loop, accepting a burst.
    `source`: any open descriptor (duplicated once, then closed). Returns the descriptor number
    reached (0 if none could be had)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = (count if soft == resource.RLIM_INFINITY else min(count, soft)) - 1
    if highest <= source:
        return 0
    try:
        # The lowest free descriptor at or above `highest` (dup2 would close one in use there).
        reached = fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, highest)
    except OSError:  # the limit is reached already: the accept loop's EMFILE handling takes over
        return 0
    os.close(reached)
    return reached


class GuardedTCPSite(web.BaseSite):
    """``web.TCPSite`` with its own accept loop: out of file descriptors (EMFILE) it waits, with
    backoff up to a second, and logs at most once per ``ACCEPT_ERROR_LOG_INTERVAL``; accepting
    resumes by itself when descriptors free up."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str | None,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        ssl_handshake_timeout: float = 60.0,
        backlog: int = LISTEN_BACKLOG,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host = host
        self._port = port
        self._ssl_handshake_timeout = ssl_handshake_timeout
        self._sockets: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._handing_over: set[asyncio.Task[Any]] = set()
        self._errors = _RateLimitedLog(ACCEPT_ERROR_LOG_INTERVAL)

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        port = self._sockets[0].getsockname()[1] if self._sockets else self._port
        return f"{scheme}://{self._host or '0.0.0.0'}:{port}"

    async def start(self) -> None:
        await super().start()
        self._sockets = _listening_sockets(self._host, self._port, self._backlog)
        limits = getattr(self._runner, "limits", None) or ConnectionLimits()
        reserve_descriptors(
            limits.max_connections * DESCRIPTORS_PER_CONNECTION + DESCRIPTORS_MARGIN, self._sockets[0].fileno()
        )
        self._server = _Listening(self._sockets, self._close_sockets)  # type: ignore[assignment]
        self._accepting = [asyncio.create_task(self._accept_loop(sock)) for sock in self._sockets]
        for sock in self._sockets:
            waiting_requests().watch(sock.fileno())  # a new connection ends a runtime's slice at once

    async def stop(self) -> None:
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)  # readers removed first
        self._accepting = []
        await super().stop()  # closes the sockets (`_close_sockets`), unregisters the site

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        backoff = ACCEPT_BACKOFF_FIRST
        accepted = 0  # since this loop last gave the others a turn
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # that client is gone; the next one may be fine
                reason = "out of file descriptors or memory" if exc.errno in RESOURCE_ERRNOS else "error"
                self._errors.warning(
                    "cannot accept connections (%s: %s); retrying for as long as it lasts", reason, exc
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_BACKOFF_MAX)
                continue
            backoff = ACCEPT_BACKOFF_FIRST
            # A request is on its way: runtimes give way from now (the protocol takes this over).
            waiting_requests().arrived(conn.fileno())
            self._hand_over(loop, conn)
            accepted += 1
            if accepted >= ACCEPT_BATCH:
                accepted = 0
                await asyncio.sleep(0)  # a loop turn for the connections already accepted

    def _hand_over(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        server = self._runner.server
        assert server is not None
        factory: Callable[[], asyncio.BaseProtocol] = server
        if self._ssl_context is None:
            connecting: Awaitable[Any] = loop.connect_accepted_socket(factory, conn)
        else:
            connecting = loop.connect_accepted_socket(
                factory, conn, ssl=self._ssl_context, ssl_handshake_timeout=self._ssl_handshake_timeout
            )
        task = asyncio.ensure_future(connecting)
        self._handing_over.add(task)
        task.add_done_callback(lambda done: self._handed_over(done, conn))

    def _handed_over(self, task: asyncio.Future[Any], conn: socket.socket) -> None:
        self._handing_over.discard(task)  # type: ignore[arg-type]
        if task.cancelled() or task.exception() is not None:
            with contextlib.suppress(OSError):
                conn.close()  # e.g. a failed TLS handshake
