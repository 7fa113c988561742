"""Give freed heap memory back to the system after runs end (glibc only).

A run of 20,000 deltas allocates and frees tens of megabytes across the loop and the storage
threads. glibc keeps freed pages in its arenas, fragmented, so RSS climbed run after run (from
129 to 369 MB over 1,000 runs in `bench/bench_memory.py`) though the Python heap did not grow
(tracemalloc: flat). `malloc_trim(0)` returns those pages; it runs on a worker thread (ctypes
releases the GIL), at most once per `TRIM_EVERY` seconds, after a run ends, right after a full
garbage collection on the loop.

Cycles freed by a run wait for a full collection, which the serving GC thresholds
(`tune_gc_for_serving`) make rare; each can hold a run's buffers and pin the allocator's pages, so
a full `gc.collect()` on the loop comes right before each trim (3-14 ms, measured under load).
Serving with `PYTHONMALLOC=malloc` was measured too and settled worse (see docs/performance.md).
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

log = logging.getLogger("agent_gateway.allocator")

TRIM_EVERY = 5.0  # seconds; a collection and a trim take a few milliseconds each


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
    def __init__(self, executor: Executor | None) -> None:
        self._trim = _find_malloc_trim()
        self._executor = executor
        self._last = 0.0
        self._running: asyncio.Future[Any] | None = None
        self.trims = 0
        self.collected = 0  # unreachable objects the collections before trims found

    def after_run(self, run: Any) -> None:
        """A run listener: trim once a run has ended, unless a trim ran in the last TRIM_EVERY s."""
        if self._trim is None or not getattr(run, "is_terminal", False):
            return
        now = time.monotonic()
        if now - self._last < TRIM_EVERY or (self._running is not None and not self._running.done()):
            return
        self._last = now
        # Cycles freed by the run wait for a full collection, which the serving GC thresholds make
        # rare, and each can hold a run's buffers: collect first, or the trim finds them in use.
        started = time.perf_counter()
        self.collected += gc.collect()
        log.debug("collected garbage in %.1f ms before the trim", 1000 * (time.perf_counter() - started))
        self._running = asyncio.get_running_loop().run_in_executor(self._executor, self._trim, 0)
        self._running.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            return
        if future.exception() is not None:
            log.warning("malloc_trim failed: %s", future.exception())
            return
        self.trims += 1
