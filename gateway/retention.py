"""Storage upkeep in the background: compaction of ended runs and retention (``[storage]``).

- ``compact_after_terminal``: when a run's terminal event is journalled, the run is queued; at
  the next lull in the journal (no event for QUIET_SECONDS, waited for at most MAX_DEFER_SECONDS)
  and once the journal has committed it, the storage's ``compact_run`` folds its text deltas into
  fewer stored events (see ``Storage.compact_run`` for the invariants).
- ``retain_days``: every ``maintenance_interval_seconds`` (and once at start-up), ended runs last
  updated more than that many days ago whose session is not pinned are deleted, a bounded batch
  of events per storage call.

Everything runs in one task started and stopped with the app, through the storage worker threads:
never on a request's path, and each storage call is a short transaction so the journal's writer
only ever waits briefly. A storage without these methods is simply not maintained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from agent_gateway.journal import Journal
from agent_gateway.models import Event
from agent_gateway.storage import Storage

log = logging.getLogger("agent_gateway.retention")

DAY_MS = 86_400_000
# Runs listed per retention query, and events deleted per storage call (one transaction).
EXPIRED_RUNS_PER_QUERY = 100
DELETE_EVENTS_PER_STEP = 2000
# Compaction waits for the journal to take no event for this long (seconds), at most MAX_DEFER.
QUIET_SECONDS = 0.2
MAX_DEFER_SECONDS = 30.0


class StorageMaintenance:
    def __init__(
        self,
        storage: Storage,
        journal: Journal,
        executor: Executor | None,
        *,
        compact: bool,
        retain_days: float,
        interval_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self.journal = journal
        self.executor = executor
        self.compact = compact and hasattr(storage, "compact_run")
        self.retain_days = retain_days if hasattr(storage, "delete_run_history") else 0.0
        self.interval = interval_seconds
        self.clock = clock
        self._to_compact: deque[str] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._swept = asyncio.Event()  # set once the task has finished a sweep
        self._next_sweep = 0.0
        # Figures for /metrics and the benchmark.
        self.runs_compacted = 0
        self.events_compacted_away = 0
        self.runs_deleted = 0
        self.errors = 0

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.compact and self.retain_days <= 0:
            return
        if self.compact:
            self.journal.on_append.append(self._on_event)
        self._next_sweep = time.monotonic()  # a first sweep right away, in the background
        self._task = asyncio.create_task(self._loop(), name="storage-maintenance")

    async def stop(self) -> None:
        if self._on_event in self.journal.on_append:
            self.journal.on_append.remove(self._on_event)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _on_event(self, event: Event) -> None:
        if event.is_terminal:
            self._to_compact.append(event.host_run_id)
            self._idle.clear()
            self._wake.set()

    async def settled(self) -> None:
        """Wait until every run queued for compaction so far has been compacted."""
        await self._idle.wait()

    async def swept(self) -> None:
        """Wait until the background task has finished (or failed) its first sweep."""
        await self._swept.wait()

    # -- the task -------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            if self._to_compact:
                await self._compact_queued()
            if self.retain_days > 0 and time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + self.interval
                try:
                    await self.sweep()
                except Exception:
                    self.errors += 1
                    log.exception("retention sweep failed; next attempt in %.0f s", self.interval)
                self._swept.set()
            if not self._to_compact:
                self._idle.set()
                self._wake.clear()
                timeout = max(0.0, self._next_sweep - time.monotonic()) if self.retain_days > 0 else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)

    async def _wait_for_a_lull(self) -> None:
        """Give way to live traffic: wait until the journal has taken no event for QUIET_SECONDS
        (compaction's CPU work would otherwise compete with a streaming run's), but no longer
        than MAX_DEFER_SECONDS, so a gateway that is never quiet still compacts."""
        deadline = time.monotonic() + MAX_DEFER_SECONDS
        while time.monotonic() < deadline:
            appended = self.journal.appended
            await asyncio.sleep(QUIET_SECONDS)  # sampling the journal's activity, not synchronisation
            if self.journal.appended == appended:
                return

    async def _compact_queued(self) -> None:
        while self._to_compact:
            await self._wait_for_a_lull()
            # Only committed events are compacted: wait for the journal to store what it has.
            await self.journal.flush()
            host_run_id = self._to_compact.popleft()
            try:
                before, after = await self._in_storage(self.storage.compact_run, host_run_id)  # type: ignore[attr-defined]
            except Exception:
                self.errors += 1
                log.exception("compaction of run %s failed; its events stay as they are", host_run_id)
                continue
            if before > after:
                self.runs_compacted += 1
                self.events_compacted_away += before - after
                log.debug("compacted run %s: %d stored events -> %d", host_run_id, before, after)

    async def sweep(self) -> int:
        """Delete every expired run (``retain_days``), a bounded step per storage call; returns
        how many runs were deleted."""
        if self.retain_days <= 0:
            return 0
        before_ms = int(self.clock() * 1000 - self.retain_days * DAY_MS)
        storage: Any = self.storage
        deleted = 0
        while True:
            expired: list[str] = await self._in_storage(storage.expired_runs, before_ms, EXPIRED_RUNS_PER_QUERY)
            for host_run_id in expired:
                # Bounded: each step deletes DELETE_EVENTS_PER_STEP events or finishes the run.
                while not await self._in_storage(
                    storage.delete_run_history, host_run_id, before_ms, DELETE_EVENTS_PER_STEP
                ):
                    pass
                deleted += 1
            if len(expired) < EXPIRED_RUNS_PER_QUERY:
                break
        if deleted:
            self.runs_deleted += deleted
            log.info("retention: deleted %d run(s) ended more than %g day(s) ago", deleted, self.retain_days)
        return deleted

    async def _in_storage(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
