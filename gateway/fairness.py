"""Requests before bulk work: a runtime streaming at full speed holds back its next slice of work
while HTTP requests that have just arrived wait for their answer.

A run fed by a fast upstream keeps the event loop busy: every loop iteration parses a slice of
its input, publishes the events and writes them to its clients, about a millisecond in all. A
request needs a few iterations before its handler runs (the socket read, the connection's task,
the handler's task) and each worker trip it makes (a storage read) costs more of them, so it
waits a few slices for each. Here the gateway's HTTP server marks a request as waiting from its
connection's accept (or its first bytes, on a kept-alive connection) until its response (or a
stream's first events) is written, and `yield_slice` (which runtimes call between slices)
pauses while one that arrived in the last `PRIORITY_SECONDS` waits: the loop then turns in
microseconds, and a worker thread gets the GIL without waiting for it. A request that takes
longer stops counting after `PRIORITY_SECONDS`, so a slow handler (a large page, a knowledge
query) costs the runs at most that; and pauses never take more than `PAUSE_SHARE` of the runs'
time, however many requests arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref

# How long one request holds back the runtimes' slices, at most.
PRIORITY_SECONDS = 0.005
# Pauses take at most this share of the runtimes' time, however many requests arrive (a client
# opening connection after connection and sending nothing would otherwise hold them back for good):
# pause time is earned at PAUSE_SHARE seconds a second, up to PAUSE_BUDGET_SECONDS banked.
PAUSE_SHARE = 0.5
PAUSE_BUDGET_SECONDS = 0.02


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
