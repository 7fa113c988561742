"""The event-loop lag monitor: how late the loop runs a timer, as a histogram and a log line.

A timer due every `INTERVAL` seconds records how much later than due it ran: that is how long
something held the loop (a runtime's emit path that never yields, a big synchronous parse, ...),
and how long any request arriving meanwhile waited before its handler could start.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("agent_gateway.loop")

INTERVAL = 0.025  # seconds between samples: cheap (40 timer callbacks a second), fine enough
# Upper bounds of the histogram's buckets, in seconds (Prometheus `le`).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOG_EVERY = 1.0  # at most one warning a second; the ones in between are counted in it


class LoopLagMonitor:
    def __init__(self, warn_after_ms: float) -> None:
        """`warn_after_ms`: log a warning for a lag above this (0: never)."""
        self.warn_after = warn_after_ms / 1000
        self.bucket_counts = [0] * len(BUCKETS)  # per bucket, not cumulative (rendered cumulative)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._last_log = 0.0
        self._unlogged = 0  # lags above the threshold since the last line

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + INTERVAL
        self._handle = loop.call_at(self._due, self._tick, loop)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        self.record(max(0.0, now - self._due))
        self._due = now + INTERVAL
        self._handle = loop.call_at(self._due, self._tick, loop)

    def record(self, lag: float) -> None:
        self.count += 1
        self.sum += lag
        self.max = max(self.max, lag)
        for index, bound in enumerate(BUCKETS):
            if lag <= bound:
                self.bucket_counts[index] += 1
                break
        if self.warn_after and lag > self.warn_after:
            self._unlogged += 1
            now = time.monotonic()
            if now - self._last_log >= LOG_EVERY:
                log.warning(
                    "event loop blocked for %.0f ms (%d lag(s) over %.0f ms since the last line)",
                    lag * 1000,
                    self._unlogged,
                    self.warn_after * 1000,
                )
                self._last_log = now
                self._unlogged = 0

    def cumulative(self) -> list[tuple[str, int]]:
        """(`le` label, cumulative count) per bucket, ending with +Inf."""
        out, total = [], 0
        for bound, count in zip(BUCKETS, self.bucket_counts, strict=True):
            total += count
            out.append((repr(bound), total))
        out.append(("+Inf", self.count))
        return out
