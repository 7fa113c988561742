"""Give freed heap memory back to the system after runs end (glibc only).

A run of 20,000 deltas allocates and frees tens of megabytes across the loop and the storage
threads. glibc keeps freed pages in its arenas, fragmented, so RSS climbed run after run (from
129 to 369 MB over 1,000 runs in `bench/bench_memory.py`) though the Python heap did not grow
(tracemalloc: flat). `malloc_trim(0)` returns those pages; it runs on a worker thread (ctypes
releases the GIL).

When a pass runs:
- idle pass: the last active run just ended. A full `gc.collect()` on the loop (3-14 ms, longer
  with a big run in memory) and then the trim. Nothing is streaming, so the collection delays no
  one's events. At most once per `IDLE_PASS_EVERY` seconds; an idle end inside that period
  schedules one pass at its end (if the gateway is still idle then), so memory always settles
  after the last run.
- busy pass: a gateway that is never idle collects and trims when a run ends, at most once per
  `BUSY_PASS_EVERY` seconds. Without the collection (tried: it lands in other runs' streams),
  back-to-back runs of the memory bench, which look busy, sat 60-100 MB higher and reached
  585-910 MB for a moment before a rare full collection freed what had piled up.

Why a collection at all: the serving GC thresholds (`tune_gc_for_serving`) make full collections
rare, and garbage in reference cycles pins allocator pages the trim cannot return. The gateway's
own per-run cycle (a finished run's turn and its callbacks) is broken where the run ends
(`RunManager._finish`), so what the idle collection still finds is other code's (runtimes,
libraries: asyncio's closed transports keep a bound method of themselves). Serving with
`PYTHONMALLOC=malloc` was measured too and settled worse (see docs/performance.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

log = logging.getLogger("agent_gateway.server.allocator")

# Seconds between two idle passes (collection + trim): a stream of short runs, each ending with the
# gateway idle, costs at most one collection per period.
IDLE_PASS_EVERY = 5.0
# Seconds between two passes of a gateway that always has a run active. Back-to-back runs look busy
# (the next one is created before the last one's end is seen): at 60 s they made a quarter fewer
# passes than the old 5 s trims and held 40-70 MB more mid-run.
BUSY_PASS_EVERY = 5.0


def _find_malloc_trim() -> Callable[[int], Any] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim  # glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """A run listener (`after_run`); `active_runs` counts the runs the gateway is executing."""

    def __init__(self, executor: Executor | None, active_runs: Callable[[], int]) -> None:
        self._trim = _find_malloc_trim()
        self._executor = executor
        self._active_runs = active_runs
        self.idle_pass_every = IDLE_PASS_EVERY
        self.busy_pass_every = BUSY_PASS_EVERY
        self._created = time.monotonic()
        self._last: float | None = None  # when the last pass started
        self._running: asyncio.Future[Any] | None = None
        self._deferred: asyncio.TimerHandle | None = None
        self.trims = 0
        self.collections = 0
        self.collected = 0  # unreachable objects the idle passes' collections found

    def after_run(self, run: Any) -> None:
        """Trim once a run has ended: now if the gateway is idle (or soon, see the module's
        docstring), else only if no pass ran for `busy_pass_every` seconds."""
        if self._trim is None or not getattr(run, "is_terminal", False):
            return
        now = time.monotonic()
        if self._active_runs() == 0:
            wait = 0.0 if self._last is None else self._last + self.idle_pass_every - now
            if wait <= 0:
                self._pass(collect=True)
            elif self._deferred is None:
                self._deferred = asyncio.get_running_loop().call_later(wait, self._deferred_idle_pass)
        elif now - (self._created if self._last is None else self._last) >= self.busy_pass_every:
            self._pass(collect=True)

    def _deferred_idle_pass(self) -> None:
        self._deferred = None
        if self._active_runs() == 0:  # else the next run to end decides
            self._pass(collect=True)

    def _pass(self, collect: bool) -> None:
        if self._running is not None and not self._running.done():
            return  # a trim is under way; it frees what this one would
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        if collect:
            started = time.perf_counter()
            self.collected += gc.collect()
            self.collections += 1
            log.debug("collected garbage in %.1f ms before the trim", 1000 * (time.perf_counter() - started))
        # The period counts from the end of the collection: a slow one (a big heap, a loaded
        # machine) must not let the next end pass again at once.
        self._last = time.monotonic()
        self._running = asyncio.get_running_loop().run_in_executor(self._executor, self._trim, 0)
        self._running.add_done_callback(self._done)

    def stop(self) -> None:
        """Drop a scheduled pass (the gateway is stopping)."""
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None

    def _done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        if future.exception() is not None:
            log.warning("malloc_trim failed: %s", future.exception())
            return
        self.trims += 1
