"""Requests before bulk work: a runtime streaming at full speed holds back its next slice of work
while HTTP requests that have just arrived wait for their answer.

A run fed by a fast upstream keeps the event loop busy: every loop iteration parses a slice of
its input, publishes the events and writes them to its clients, about a millisecond in all. A
request needs a few iterations before its handler runs (the socket read, the connection's task,
the handler's task) and each worker trip it makes (a storage read) costs more of them, so it
waits a few slices for each. Here the gateway's HTTP server marks a request as waiting from its
connection's accept (or its first bytes, on a kept-alive connection) until its response (or a
stream's first events) is written. A runtime's slice (`WorkSlices`) ends early once a request's
bytes reach the gateway's sockets (an edge-triggered epoll set of its own, polled without
waiting), and `yield_slice` (which runtimes call between slices)
pauses while one that arrived in the last `PRIORITY_SECONDS` waits: the loop then turns in
microseconds, and a worker thread gets the GIL without waiting for it. A request that takes
longer stops counting after `PRIORITY_SECONDS`, so a slow handler (a large page, a knowledge
query) costs the runs at most that; and pauses never take more than `PAUSE_SHARE` of the runs'
time, however many requests arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import select
import time
import weakref
from typing import Any

# A slice (`WorkSlices`) asks whether a request arrived every this many steps: one syscall, about a
# microsecond, against several of parsing per step.
ARRIVAL_CHECK_STEPS = 16
# How long one request holds back the runtimes' slices, at most.
PRIORITY_SECONDS = 0.005
# Pauses take at most this share of the runtimes' time, however many requests arrive (a client
# opening connection after connection and sending nothing would otherwise hold them back for good):
# pause time is earned at PAUSE_SHARE seconds a second, up to PAUSE_BUDGET_SECONDS banked.
PAUSE_SHARE = 0.5
PAUSE_BUDGET_SECONDS = 0.02


def _load_epoll_wait() -> Any:
    """libc's `epoll_wait`, called without releasing the GIL (None where it cannot be had).

    `select.epoll.poll` releases the GIL around its system call, even with a zero timeout: a
    worker waiting for the GIL (the journal's writer, a storage call) takes it there, and the
    loop waits to get it back. Asked every few steps of a streaming run's slices, that cost the
    run 14 % of its loop CPU per delta in bench_fairness.py. A zero-timeout `epoll_wait` never
    blocks, so holding the GIL through it costs nothing."""
    try:
        function = ctypes.PyDLL(None).epoll_wait  # PyDLL: the GIL stays held during the call
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_epoll_wait_keeping_gil = _load_epoll_wait() if hasattr(select, "epoll") else None
# Room for the one `struct epoll_event` a check asks for (12 bytes on x86-64, 16 elsewhere).
_EPOLL_EVENT = ctypes.create_string_buffer(16)


class WaitingRequests:
    """One loop's HTTP requests received and not yet answered, by connection, with the time each
    arrived, oldest first (so dropping the ones that no longer count, and finding the newest,
    take constant time: 10,000 clients reconnecting at once cost no more per request)."""

    def __init__(self) -> None:
        self._since: dict[object, float] = {}
        self._none_waiting = asyncio.Event()  # set while no request counts
        self._none_waiting.set()
        self._budget = PAUSE_BUDGET_SECONDS  # pause time the runtimes may still take
        self._budget_at = time.monotonic()
        self._arrivals: select.epoll | None = None  # the sockets `arriving` looks at (Linux)

    def watch(self, fd: int) -> None:
        """Let `arriving` see new bytes on `fd`: a listening socket (a new connection) or a
        connection that may carry another request."""
        if self._arrivals is None:
            if not hasattr(select, "epoll"):
                return  # not Linux: slices end by their time and step count only
            self._arrivals = select.epoll()
        with contextlib.suppress(OSError):  # (already watched)
            self._arrivals.register(fd, select.EPOLLIN | select.EPOLLET)

    def unwatch(self, fd: int) -> None:
        """Stop watching `fd` (before it closes: a closed descriptor's number is soon reused)."""
        if self._arrivals is not None:
            with contextlib.suppress(OSError, ValueError):
                self._arrivals.unregister(fd)

    def arriving(self) -> bool:
        """True if a watched socket received bytes (a request's first ones, a new connection)
        since anyone last asked: one non-blocking `epoll_wait` on edges, so a runtime can ask
        every few steps of a slice and end it at once, instead of after its time is up. The
        GIL stays with the caller (`_epoll_wait_keeping_gil`)."""
        arrivals = self._arrivals
        if arrivals is None:
            return False
        if _epoll_wait_keeping_gil is not None:
            return _epoll_wait_keeping_gil(arrivals.fileno(), _EPOLL_EVENT, 1, 0) > 0
        return bool(arrivals.poll(0, 1))

    def holding(self) -> bool:
        """Whether a request that arrived within PRIORITY_SECONDS waits for its answer, so a
        runtime's work should give way (`yield_slice`) now. One dict check while none waits."""
        return bool(self._since) and self.time_left() > 0

    def pause_budget(self) -> float:
        """Seconds of pause the runtimes may take now (see PAUSE_SHARE)."""
        now = time.monotonic()
        self._budget = min(PAUSE_BUDGET_SECONDS, self._budget + (now - self._budget_at) * PAUSE_SHARE)
        self._budget_at = now
        return self._budget

    def paused(self, seconds: float) -> None:
        self._budget -= seconds

    def arrived(self, connection: object) -> None:
        """A connection was accepted, or its request began to arrive (its first bytes)."""
        self._since.setdefault(connection, time.monotonic())
        self._none_waiting.clear()

    def moved(self, before: object, after: object) -> None:
        """The request waiting under `before` (an accepted socket's descriptor) now waits under
        `after` (its connection's protocol), since the time it arrived."""
        arrived = self._since.pop(before, None)
        if arrived is not None:
            self._since[after] = arrived

    def answered(self, connection: object) -> None:
        """The connection's response (or a stream's first events) is written, or it closed."""
        if self._since.pop(connection, None) is not None:
            self.time_left()

    def time_left(self) -> float:
        """Seconds until no waiting request counts any more (0 if none does): one counts for
        PRIORITY_SECONDS after it arrived. The ones that no longer count are dropped here."""
        since = self._since
        if since:
            oldest_counted = time.monotonic() - PRIORITY_SECONDS
            while since:
                oldest = next(iter(since))
                if since[oldest] >= oldest_counted:
                    return next(reversed(since.values())) - oldest_counted  # the newest is last
                del since[oldest]
        self._none_waiting.set()
        return 0.0

    async def none_waiting(self) -> None:
        await self._none_waiting.wait()

    def __len__(self) -> int:
        return len(self._since)


_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, WaitingRequests] = weakref.WeakKeyDictionary()


def waiting_requests() -> WaitingRequests:
    """The running loop's waiting requests."""
    loop = asyncio.get_running_loop()
    found = _by_loop.get(loop)
    if found is None:
        found = _by_loop[loop] = WaitingRequests()
    return found


async def yield_slice() -> None:
    """End a slice of a runtime's work (parsing a buffered upstream, reading an agent's output):
    one loop turn, then, while requests that just arrived wait for their answer, a pause until
    they are answered (at most PRIORITY_SECONDS, and within the pause budget). Call it every few
    hundred microseconds of work that would not otherwise suspend."""
    await asyncio.sleep(0)
    requests = waiting_requests()
    wait = requests.time_left()
    if wait > 0:
        wait = min(wait, requests.pause_budget())
    if wait > 0:
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await requests.none_waiting()
        requests.paused(time.monotonic() - started)


class WorkSlices:
    """Cuts a runtime's work that does not suspend on its own (parsing an upstream's buffered
    response, an agent's output) into slices, with `yield_slice` between them. A slice ends after
    `seconds` or `steps` steps, or early when a request arrives at the gateway (asked every
    ARRIVAL_CHECK_STEPS steps): the loop then reads it now rather than after the slice.

        slices = WorkSlices()
        async for line in response.content:
            if slices.over():  # counts one step
                await slices.next()
            ...
    """

    __slots__ = ("_arriving", "_ends", "_seconds", "_steps", "_steps_left")

    def __init__(self, seconds: float = 0.0005, steps: int = 256) -> None:
        self._seconds = seconds
        self._steps = steps
        self._arriving = waiting_requests().arriving
        self._ends = time.perf_counter() + seconds
        self._steps_left = steps

    def over(self) -> bool:
        """Count one step; True when this slice is over (then `await next()`)."""
        left = self._steps_left = self._steps_left - 1
        return left <= 0 or time.perf_counter() >= self._ends or (not left % ARRIVAL_CHECK_STEPS and self._arriving())

    async def next(self) -> None:
        """Yield to the loop (`yield_slice`), then start the next slice."""
        await yield_slice()
        self._ends = time.perf_counter() + self._seconds
        self._steps_left = self._steps
