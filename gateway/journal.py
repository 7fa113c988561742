"""The event journal: assigns seqs, enforces the terminal rule, spools, publishes, group-commits.

An event takes one path: `append` gives it the run's next seq; then, once per loop tick for all
events appended in it, `publish` builds each run's SSE frames once, writes them to the spool (a
local append-only file: one `write()` call, so they survive a killed process), keeps them in the
run's tail (replays of a running run come from there), hands each run's events and frames to the
bus as one batch, and queues them for storage. A writer task commits
queued events in batches (group commit) on a worker thread. Delivery never waits on the
database; at start-up, spooled events missing from storage are written back before anything else
runs, so a seq a client has seen is never given to another event.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import functools
import json
import logging
import mmap
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, islice
from pathlib import Path
from typing import Any, NamedTuple

from agent_gateway.bus import Bus
from agent_gateway.cluster import NotOwner
from agent_gateway.models import TERMINAL_KINDS, Event, sse_frames
from agent_gateway.storage import Storage

log = logging.getLogger("agent_gateway.journal")

SPOOL_SEGMENT_BYTES = 32 * 1024 * 1024
RECOVERY_BATCH = 5000
# A spool line that is not an SSE frame: `record: <kind> <json>`, a write handed to `write_behind`.
SPOOL_RECORD = b"record: "
# A group commit takes about this much of the writer thread's CPU time (its size follows the
# rate the last commits ran at), so a run row written ahead of the next commit (`write`) waits
# for one short transaction, not for thousands of events. CPU time, not wall time: waits for the
# GIL while the loop is busy would otherwise shrink commits to a size where overhead dominates.
COMMIT_TARGET_SECONDS = 0.003
COMMIT_MIN_EVENTS = 256
# A writer that was idle waits up to this long before its next commit (`_gather`), unless one of
# the queued runs ends, COMMIT_MIN_EVENTS wait (a fast run, whose commits must keep up from its
# start) or something waits for the commit (`commit_soon`): a short run goes to storage in one
# commit, a model-paced stream (a delta every 10 ms) in one commit per 10 deltas, not one per
# delta (bench_paced_runs.py: its CPU 0.6-0.7x). Not in cluster mode, where delivery waits for
# the commit. The events are spooled first: a killed process loses none of them.
COMMIT_GATHER_SECONDS = 0.1
# How long `write` waits for a group commit to end before it writes anyway (storage stuck).
PRIORITY_WAIT_SECONDS = 0.25
BURST_EVENTS = 64
BURST_PUBLISH = 256
# A runtime that emits without ever yielding to the loop still gets its events published (and
# `max_pending` enforced) every this many events.
PUBLISH_EVERY = 1024
# Events waiting for storage before runtimes wait for it (`max_pending`). A runtime faster than
# storage (a fast chat upstream against SQLite) otherwise piles up a backlog across runs: 200,000
# events raised RSS by 100-200 MB that the allocator never gave back (bench_memory.py).
MAX_PENDING = 20_000
# Bytes of open runs' SSE frames kept in memory for replays, in all (`tail_bytes`).
TAIL_BYTES = 32 * 1024 * 1024
TAIL_FIRST_REGION = 64 * 1024


class TailFrames(NamedTuple):
    """Consecutive events of a run as their SSE frames (`Journal.read_frames`)."""

    frames: bytes
    last_seq: int
    count: int
    terminal: bool  # the last one is the run's terminal event
    caught_up: bool  # the last one is the last event published so far


def _frame_end(frames: bytes | mmap.mmap, count: int, start: int = 0) -> int:
    """Where the `count`-th SSE frame from `start` ends (a frame ends with its blank line; the
    wire JSON in its `data:` line holds no raw newline)."""
    position = start
    for _ in range(count):
        found = frames.find(b"\n\n", position)
        if found < 0:
            raise ValueError("fewer frames than events")
        position = found + 2
    return position


class _RunTail:
    """A run's published SSE frames, appended to an anonymous memory map of its own that is
    unmapped whole when the run is forgotten: the memory goes back to the system at once,
    whatever else the allocator keeps."""

    __slots__ = ("entries", "full", "region", "used")

    def __init__(self) -> None:
        # Private: a shared anonymous map cannot grow (its pages past the first size fault).
        self.region = mmap.mmap(-1, TAIL_FIRST_REGION, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.used = 0
        self.entries: list[tuple[int, int, bool, int, int]] = []  # first, last seq, terminal, start, end
        self.full = False  # a batch did not fit: nothing later is added (the tail stays gapless)

    def append(self, first: int, last: int, terminal: bool, frames: bytes) -> None:
        start, end = self.used, self.used + len(frames)
        if end > len(self.region):
            self.region.resize(max(end, 2 * len(self.region)))
        self.region[start:end] = frames
        self.used = end
        self.entries.append((first, last, terminal, start, end))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _After(NamedTuple):
    """A write handed over by `Journal.write_after`."""

    after: int  # made once events up to this number are stored
    call: Callable[[], Any]
    future: asyncio.Future[Any]
    retry: bool


class JournalClosed(Exception):
    pass


class JournalFull(Exception):
    """`append_nowait` found `max_pending` events waiting for storage."""


class _SpoolSegment:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live segment is never recovered
        self.size = 0
        self.last_number = 0

    def write(self, data: bytes) -> None:
        """Append `data` (a partial write is finished, not split into another call's data)."""
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.size += len(data)

    def close(self, remove: bool) -> None:
        os.close(self.fd)
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


class Journal:
    def __init__(
        self,
        storage: Storage,
        bus: Bus,
        spool_dir: Path | None,
        *,
        batch_max: int = 5000,
        max_pending: int = MAX_PENDING,
        read_executor: ThreadPoolExecutor | None = None,
        durable_delivery: bool = False,
        tail_bytes: int = TAIL_BYTES,
    ) -> None:
        self.storage = storage
        self.bus = bus
        self.spool_dir = spool_dir
        self.batch_max = batch_max
        self.max_pending = max_pending
        self._write_executor = ThreadPoolExecutor(1, thread_name_prefix="journal-writer")
        self._read_executor = read_executor
        self._next_seq: dict[str, int] = {}
        self._terminal: set[str] = set()
        # Runs that take no more events but their terminal one: the ended ones (`_terminal`) and
        # the sealed ones (`seal`). One look-up in `append_nowait` covers both.
        self._stopped: set[str] = set()
        # Published events waiting for storage, as the per-run batches `publish` made (oldest first),
        # and the same batches per run (for reads of the uncommitted tail).
        self._queue: deque[list[Event]] = deque()
        self._queued = 0
        self._pending_by_run: dict[str, deque[list[Event]]] = {}
        # The SSE frames `publish` built for each open run, oldest first (its tail): a client that
        # attaches to a running run late, or resumes it, replays them from memory. A storage read
        # takes a worker thread that holds the GIL for every row it turns into an event (5.8 us a
        # row: a 20,000-event replay stalled the loop ~0.1 s in 5 ms slices).
        self._tail_by_run: dict[str, _RunTail] = {}
        self._tailed = 0  # bytes in all tails
        self.tail_bytes = tail_bytes
        self._appended = 0  # numbers every published event
        self._committed = 0
        self._queue_ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._flush_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._segments: deque[_SpoolSegment] = deque()
        self._segment_counter = 0
        self._instance = secrets.token_hex(4)
        # Events appended since the last `publish`, per run, in order.
        self._unpublished: dict[str, list[Event]] = {}
        self._unpublished_count = 0
        self._burst = False
        self._deferred_at = 0  # events waiting when `_publish_tick` last waited
        self._closed = False
        self.commit_errors = 0
        self.batches = 0
        self.last_commit_at = 0.0  # time.monotonic() of the last successful commit
        # Held by each group commit and by `write` (run rows go between two commits).
        self._storage_lock = threading.Lock()
        # Storage writes handed over by `write_behind`, oldest first: each commit and each `write`
        # makes them first (under `_behind_lock`, so they are made once and in order).
        self._behind: deque[Callable[[], Any]] = deque()
        self._behind_lock = threading.Lock()
        # Writes handed over by `write_after`, oldest first: each with the number of the last
        # event appended before it (`_appended`), the future its caller awaits, and whether it
        # waits out failed commits.
        self._after: deque[_After] = deque()
        self.priority_wait = PRIORITY_WAIT_SECONDS
        self.commit_gather = COMMIT_GATHER_SECONDS
        # The idle writer's gather: cut short once set (`commit_soon`), and what it awaits.
        self._commit_now = False
        self._gather_waiter: asyncio.Future[None] | None = None
        # Events per group commit, adapted to COMMIT_TARGET_SECONDS (starts at `batch_max`).
        self.commit_limit = batch_max
        self.on_append: list[Callable[[Event], None]] = []
        # Called with each run's published batch (its id, its events in seq order): one call per
        # batch, for hooks that follow every event of a run cheaply (the session index's fold).
        self.on_publish: list[Callable[[str, list[Event]], None]] = []
        # Called with each run's published batch and its size in bytes (its SSE frames, built
        # once for the spool and the bus anyway): what run and actor byte limits count.
        self.on_published_bytes: Callable[[str, int], None] | None = None
        # By kind, what makes a spooled `write_behind` record's write again at start-up (a worker
        # thread, before the events spooled after it are stored).
        self.record_handlers: dict[str, Callable[[Any], None]] = {}
        # Cluster mode: events go to the bus only once committed (never one a crash can take
        # back), and `on_commit` hooks get each committed per-run batch (to relay it).
        self.durable_delivery = durable_delivery
        self.on_commit: list[Callable[[list[Event]], None]] = []
        self.fenced = 0  # events dropped because this instance lost its lease

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.spool_dir is not None:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            await self._in_writer(self._recover_spool)
            self._open_segment()
        self._writer = asyncio.create_task(self._write_loop(), name="journal-writer")

    async def close(self) -> None:
        if self._closed:
            return
        self.publish()
        await self.flush()
        self._closed = True
        if self._writer is not None:
            # The writer ends once nothing is left to store (the writes handed over meanwhile, a
            # run's end or its index): never cancelled mid-commit, whose worker would go on without
            # it (its `write_after` callers waiting forever), the loop blocked below joining it.
            self._queue_ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        for segment in self._segments:
            segment.close(remove=True)
        self._segments.clear()
        self._write_executor.shutdown(wait=True)

    # -- runs -------------------------------------------------------------------------------------
    def open_run(self, host_run_id: str, next_seq: int = 1, terminal: bool = False) -> None:
        """Start tracking a run whose next seq is `next_seq`."""
        self._next_seq[host_run_id] = max(next_seq, self._next_seq.get(host_run_id, 1))
        if terminal:
            self._terminal.add(host_run_id)
            self._stopped.add(host_run_id)

    def is_open(self, host_run_id: str) -> bool:
        return host_run_id in self._next_seq

    def has_terminal(self, host_run_id: str) -> bool:
        return host_run_id in self._terminal

    def seal(self, host_run_id: str) -> None:
        """Take no more events of an open run but its terminal one (a run over its byte limit:
        what its runtime still emits while it stops is dropped)."""
        if host_run_id in self._next_seq:
            self._stopped.add(host_run_id)

    def forget_run(self, host_run_id: str) -> None:
        """Stop tracking a finished run once its events are committed."""
        if not self._pending_by_run.get(host_run_id) and host_run_id not in self._unpublished:
            self._next_seq.pop(host_run_id, None)
            self._terminal.discard(host_run_id)
            self._stopped.discard(host_run_id)
            self._drop_tail(host_run_id)

    async def append(
        self, host_run_id: str, kind: str, payload: dict[str, Any], source: str = "gateway"
    ) -> Event | None:
        """Append one event and publish it (with any earlier unpublished ones) before returning;
        returns it, or None if the run already ended (nothing is written after a terminal
        event). Waits while `max_pending` events wait for storage."""
        while True:
            try:
                # (no publish at the end of the tick: this one publishes now)
                event = self.append_nowait(host_run_id, kind, payload, source, _tick=False)
            except JournalFull:
                self.commit_soon()  # room comes with the next commit
                self._room.clear()
                await self._room.wait()
                continue
            self.publish()
            return event

    def append_nowait(
        self, host_run_id: str, kind: str, payload: dict[str, Any], source: str = "gateway", _tick: bool = True
    ) -> Event | None:
        """`append` without waiting, for runtimes that emit in bursts: the event has its seq and
        is readable at once; it is spooled and published at the end of the loop tick (or by the
        next `append` or read). Raises JournalFull when `max_pending` events wait for storage
        (then await `append`). `_tick=False` (for `append`, which publishes at once) schedules
        no publish at the tick's end."""
        if self._closed:
            raise JournalClosed("journal is closed")
        if self._queued >= self.max_pending:
            raise JournalFull(f"{self._queued} events wait for storage")
        next_seq = self._next_seq
        seq = next_seq.get(host_run_id)
        if seq is None:
            raise KeyError(f"run {host_run_id} is not open in the journal")
        if host_run_id in self._stopped:
            if host_run_id in self._terminal:
                log.warning("dropped %s after the terminal event of %s", kind, host_run_id)
                return None
            if kind not in TERMINAL_KINDS:
                return None  # sealed: only its terminal event is still taken
        next_seq[host_run_id] = seq + 1
        event = Event(host_run_id, seq, kind, source, payload)
        if kind in TERMINAL_KINDS:
            self._terminal.add(host_run_id)
            self._stopped.add(host_run_id)
        unpublished = self._unpublished
        batch = unpublished.get(host_run_id)
        if batch is not None:
            batch.append(event)
        else:
            if not unpublished and _tick:
                asyncio.get_running_loop().call_soon(self._publish_tick)
            unpublished[host_run_id] = [event]
        self._unpublished_count += 1
        if self._unpublished_count >= PUBLISH_EVERY:
            self.publish()
        return event

    def _publish_tick(self) -> None:
        """`publish` at the end of a loop tick. While a runtime emits a burst (the last publish
        took at least BURST_EVENTS), publishing waits for more loop iterations, as long as each
        adds events, until BURST_PUBLISH events wait: each client's socket then gets a few large
        writes instead of many small ones, for a few iterations of added latency."""
        count = self._unpublished_count
        if self._burst and 0 < count < BURST_PUBLISH and count != self._deferred_at:
            self._deferred_at = count
            asyncio.get_running_loop().call_soon(self._publish_tick)
            return
        self.publish()

    def publish(self) -> None:
        """Spool, then hand to the bus (one batch per run), to `on_append` hooks and to the
        storage queue every event appended since the last call. Runs at the end of each loop tick
        and before any read, so a client never sees an event the spool does not hold."""
        unpublished = self._unpublished
        if not unpublished:
            return
        self._unpublished = {}
        count, self._unpublished_count, self._deferred_at = self._unpublished_count, 0, 0
        self._appended += count
        self._burst = count >= BURST_EVENTS
        # Each run's SSE frames, joined once: the spool's lines, and what every client in step
        # with the run writes.
        blobs = [sse_frames(events) for events in unpublished.values()]
        if self._segments:
            self._spool(blobs[0] if len(blobs) == 1 else b"".join(blobs))
        queue, pending = self._queue, self._pending_by_run
        publish, hooks, count_bytes = self.bus.publish_many, self.on_append, self.on_published_bytes
        batch_hooks = self.on_publish
        keep_frames = self.tail_bytes > 0 and not self.durable_delivery
        ended = False
        for (host_run_id, events), blob in zip(unpublished.items(), blobs, strict=True):
            if count_bytes is not None:
                count_bytes(host_run_id, len(blob))
            queue.append(events)
            if keep_frames:
                self._add_tail(host_run_id, events, blob)
            self._queued += len(events)
            run_pending = pending.get(host_run_id)
            if run_pending is None:
                pending[host_run_id] = deque((events,))
            else:
                run_pending.append(events)
            ended = ended or events[-1].is_terminal
            if not self.durable_delivery:
                publish(host_run_id, events, blob)
            for batch_hook in batch_hooks:
                batch_hook(host_run_id, events)
            for hook in hooks:
                for event in events:
                    hook(event)
        if ended or self._queued >= COMMIT_MIN_EVENTS:  # (a fast run: its commits start at once)
            self.commit_soon()
        if not self._queue_ready.is_set():
            self._queue_ready.set()

    def commit_soon(self) -> None:
        """End the idle writer's gather (or skip its next one): what is queued goes to storage
        now. For a caller that waits for a commit: a flush, a write after it, a full queue."""
        self._commit_now = True
        waiter = self._gather_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _gather(self) -> None:
        """Wait up to `commit_gather` for `commit_soon`."""
        loop = asyncio.get_running_loop()
        waiter = self._gather_waiter = loop.create_future()
        timer = loop.call_later(self.commit_gather, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._gather_waiter = None

    async def flush(self) -> None:
        """Wait until every event appended so far is committed to storage."""
        self.publish()
        target = self._appended
        if self._committed >= target:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((target, future))
        self.commit_soon()
        await future

    @property
    def pending(self) -> int:
        return self._queued

    @property
    def appended(self) -> int:
        return self._appended

    # -- reads ------------------------------------------------------------------------------------
    async def read(self, host_run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """Events after `after_seq`, committed or not. The uncommitted tail is captured before the
        first await, so together with a bus subscription taken in the same step nothing is missed."""
        self.publish()
        # Cluster mode reads only what storage holds (an uncommitted event may never be stored).
        batches = None if self.durable_delivery else self._pending_by_run.get(host_run_id)
        if batches and batches[0][0].seq <= after_seq + 1:
            # Every event after `after_seq` still waits for storage (a new run's first reader):
            # no storage read, so no worker-thread round trip before the first event.
            wanted = (e for batch in batches for e in batch if e.seq > after_seq)
            return list(wanted if limit is None else islice(wanted, limit))
        snapshot = [e for batch in batches or () for e in batch if e.seq > after_seq]
        stored = await self._in_reader(self.storage.read_events, host_run_id, after_seq, limit)
        if limit is not None and len(stored) >= limit:
            return stored
        last = stored[-1].seq if stored else after_seq
        tail = [e for e in snapshot if e.seq > last]
        events = stored + tail
        return events if limit is None else events[:limit]

    def read_frames(self, host_run_id: str, after_seq: int, limit: int) -> TailFrames | None:
        """The SSE frames of up to `limit` published events after `after_seq`, from the run's tail
        in memory; None when the tail does not hold the event after `after_seq` (then `read`)."""
        tail = self._tail_by_run.get(host_run_id)
        if tail is None or not tail.entries or tail.entries[0][0] > after_seq + 1 or limit <= 0:
            return None
        entries = tail.entries
        index = bisect.bisect_left(entries, after_seq + 1, key=lambda entry: entry[1])  # ends past the cursor
        if index == len(entries):
            return None
        region = tail.region
        first, _, _, begin, _ = entries[index]
        begin = _frame_end(region, after_seq + 1 - first, begin)  # past the frames up to the cursor
        end, count, last_seq, terminal = begin, 0, after_seq, False
        for first, last, ends_run, start, stop in islice(entries, index, None):
            seq = max(first, after_seq + 1)  # the entry's first frame taken
            take = min(last - seq + 1, limit - count)
            end = stop if take == last - seq + 1 else _frame_end(region, take, max(start, begin))
            count += take
            last_seq = seq + take - 1
            terminal = ends_run and last_seq == last
            if count >= limit:
                break
        caught_up = not tail.full and last_seq == entries[-1][1]  # every published batch is in the tail
        return TailFrames(region[begin:end], last_seq, count, terminal, caught_up)

    async def last_event(self, host_run_id: str) -> Event | None:
        self.publish()
        pending = self._pending_by_run.get(host_run_id)
        if pending:
            return pending[-1][-1]
        return await self._in_reader(self.storage.last_event, host_run_id)

    async def _in_reader(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._read_executor, fn, *args)

    async def _in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._write_executor, fn, *args)

    async def write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a storage write (a run row, a status) on a worker, between two group commits: it
        takes the journal's storage lock, which each commit holds, so it waits for the commit in
        progress only (one short transaction) and the next commit waits for it. Without it, the
        write competes for SQLite's one writer lock, and a connection that finds it taken sleeps
        in SQLite's busy handler (up to 100 ms a try) long after the lock is free. A commit that
        holds the lock longer than `priority_wait` (a stuck database) is not waited for:
        run rows then go to storage as before, so delivery and run status never wait on it."""
        call = functools.partial(self._locked_write, functools.partial(fn, *args, **kwargs))
        return await asyncio.get_running_loop().run_in_executor(self._read_executor, call)

    async def write_after(self, call: Callable[[], Any], *, retry: bool = True) -> Any:
        """Make a storage write once every event appended so far is stored: on the writer thread,
        right after the group commit that stores the last of them, in the same worker call (a
        `flush` and a `write` in one trip; a run's final status, so a reader that finds it finds
        every event of the run stored). Returns its result, or raises what it raised. A commit
        that fails keeps it for the next attempt, or with `retry=False` fails it with the
        commit's error, unmade (a write that something later makes again anyway)."""
        self.publish()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._after.append(_After(self._appended, call, future, retry))
        if retry:  # (without: a write that may wait for the next run's commit, the session index)
            self.commit_soon()
        if not self._queue_ready.is_set():
            self._queue_ready.set()
        # A caller cancelled meanwhile cancels only its wait: the write stays queued, made in order.
        return await future

    def write_now(self, call: Callable[[], Any]) -> Any:
        """`write`, for code already on a worker thread: makes `call` between two group commits,
        on this thread, and returns its result."""
        return self._locked_write(call)

    def _locked_write(self, call: Callable[[], Any]) -> Any:
        acquired = self._storage_lock.acquire(timeout=self.priority_wait)
        try:
            self._write_behind_now()
            return call()
        finally:
            if acquired:
                self._storage_lock.release()

    def write_behind(self, fn: Callable[..., Any], *args: Any, record: bytes = b"") -> None:
        """Hand a storage write (a new run's row) to the journal without waiting for it: it is
        made on a worker before the next group commit, and before any later `write`, so a write
        that follows it (the run's status) finds it stored. `record` (`<kind> <json>`, one line)
        goes to the spool at once: at start-up after a kill, the handler `record_handlers` holds
        for its kind makes the write again from it. Append an event right after (without an
        await between): it is spooled beside the record, and the commit that stores it makes the
        write first."""
        self._behind.append(functools.partial(fn, *args))
        if record and self._segments:
            # No rotation here: the next event is spooled beside it.
            self._segments[-1].write(SPOOL_RECORD + record + b"\n")
        if not self._queue_ready.is_set():
            self._queue_ready.set()

    def _write_behind_now(self) -> None:
        """Make the writes `write_behind` handed over, oldest first (a worker thread). One that
        fails stays first in line, and the error goes to this caller (a retried commit makes it
        again); one refused for a lost lease (NotOwner) is dropped, as the events after it are."""
        if not self._behind:
            return
        with self._behind_lock:
            behind = self._behind
            while behind:
                try:
                    behind[0]()
                except NotOwner:
                    behind.popleft()  # no retry can make it: the run's session is another instance's
                    raise
                behind.popleft()

    # -- group commit -------------------------------------------------------------------------------
    async def _write_loop(self) -> None:
        backoff = 0.05
        failures = 0  # failed attempts in a row: events stay spooled and queued meanwhile
        idle = True  # nothing to commit when the writer last looked
        while True:
            await self._queue_ready.wait()
            if not self._queue and not self._behind and not self._after:
                if self._closed:  # (`close`) nothing is left to store
                    return
                self._queue_ready.clear()
                idle = True
                continue
            if idle and not self._commit_now and not self.durable_delivery and self.commit_gather > 0:
                # The first events after a pause: a short run's next ones (its status, its answer,
                # its end, its final status) follow within milliseconds, and join this commit.
                await self._gather()
            idle = self._commit_now = False
            # Per-run batches, oldest first, up to `commit_limit` events (the last one taken is
            # split if it goes over: a run's events stay in seq order, each part a queue entry).
            taken: list[list[Event]] = []
            count = 0
            limit = self.commit_limit
            queue = self._queue
            while len(taken) < len(queue) and count < limit:
                if count + len(queue[len(taken)]) > limit:
                    self._split_entry(len(taken), limit - count)
                events = queue[len(taken)]
                taken.append(events)
                count += len(events)
            batch = list(chain.from_iterable(taken))
            # The writes handed over by `write_after` whose events this commit stores (or stored).
            stored_through = self._committed + count
            after: list[_After] = []
            while self._after and self._after[0].after <= stored_through:
                after.append(self._after.popleft())
            delivered = True
            cpu_seconds = 0.0
            try:
                cpu_seconds, outcomes = await self._in_writer(self._commit, batch, [entry.call for entry in after])
            except NotOwner:
                # This instance lost its lease: the runs' new owner ends them; these events are
                # never stored, and (delivered only once stored) no client saw them.
                log.warning("dropped %d events: this instance no longer holds their sessions' lease", count)
                self.fenced += count
                delivered = False
                outcomes = [(False, NotOwner("this instance no longer holds the session's lease"))] * len(after)
            except Exception as exc:
                for entry in after:
                    if not entry.retry and not entry.future.done():
                        entry.future.set_exception(exc)
                # The others are made with the commit that succeeds.
                self._after.extendleft(reversed([entry for entry in after if entry.retry]))
                self.commit_errors += 1
                self.last_commit_at = 0.0  # storage no longer vouched for: health pings it
                failures += 1
                if failures == 1:
                    log.exception("journal commit of %d events failed; they stay spooled; retrying", count)
                elif failures & (failures - 1) == 0:  # a line at 2, 4, 8, ... attempts, not one per retry
                    log.warning("journal commit failing (%d attempts, %d events wait): %s", failures, self._queued, exc)
                await asyncio.sleep(backoff)  # retry pacing while storage is down, not synchronisation
                backoff = min(backoff * 2, 2.0)
                continue
            if failures:
                log.info("journal commits resumed after %d failed attempts", failures)
                failures = 0
            backoff = 0.05
            if delivered:  # (a commit refused for a lost lease says nothing of storage's speed)
                self._adapt_commit_limit(count, cpu_seconds)
            self.batches += bool(count)
            self.last_commit_at = time.monotonic()
            # The taken batches are the queue's head (only this loop pops) and each run's pending head.
            queue, pending = self._queue, self._pending_by_run
            for events in taken:
                queue.popleft()
                host_run_id = events[0].host_run_id
                run_pending = pending[host_run_id]
                run_pending.popleft()
                if not run_pending:
                    del pending[host_run_id]
                if self.durable_delivery and delivered:
                    self.bus.publish_many(host_run_id, events)
                    for hook in self.on_commit:
                        hook(events)
            self._queued -= count
            self._committed += count
            if self._queued < self.max_pending:
                self._room.set()
            self._release_flush_waiters()
            for (_, _, future, _), (made, result) in zip(after, outcomes, strict=True):
                if future.done():
                    continue
                if made:
                    future.set_result(result)
                else:
                    future.set_exception(result)
            self._drop_committed_segments()

    def _commit(self, batch: list[Event], after: list[Callable[[], Any]]) -> tuple[float, list[tuple[bool, Any]]]:
        """Store one group commit, then make the `write_after` writes it was waited for (on the
        writer thread); returns the thread's CPU seconds for the events and, for each write,
        whether it was made and its result (else the exception it raised)."""
        with self._storage_lock:
            self._write_behind_now()
            started = time.thread_time()
            if batch:
                self.storage.append_events(batch)
            seconds = time.thread_time() - started
            outcomes: list[tuple[bool, Any]] = []
            for call in after:
                try:
                    outcomes.append((True, call()))
                except Exception as exc:  # its own caller's error: the events are stored
                    outcomes.append((False, exc))
            return seconds, outcomes

    def _add_tail(self, host_run_id: str, events: list[Event], frames: bytes) -> None:
        """Append a published batch's frames to its run's tail, if all tails stay within
        `tail_bytes`; a run whose batch does not fit keeps what its tail holds and adds no more."""
        tail = self._tail_by_run.get(host_run_id)
        if tail is None:
            if self._tailed + len(frames) > self.tail_bytes or events[0].seq != 1:
                return  # a tail starts with the run's first event (its replays begin there)
            tail = self._tail_by_run[host_run_id] = _RunTail()
        elif tail.full:
            return
        if self._tailed + len(frames) > self.tail_bytes:
            tail.full = True
            return
        tail.append(events[0].seq, events[-1].seq, events[-1].is_terminal, frames)
        self._tailed += len(frames)

    def _drop_tail(self, host_run_id: str) -> None:
        tail = self._tail_by_run.pop(host_run_id, None)
        if tail is not None:
            self._tailed -= tail.used
            tail.region.close()

    def frames_of(self, host_run_id: str) -> bytes | None:
        """The SSE frames of every event of an open run, in seq order, if its tail holds them all
        (none was left out); None if not."""
        self.publish()
        tail = self._tail_by_run.get(host_run_id)
        if tail is None or tail.full:
            return None
        return tail.region[: tail.used]

    @property
    def tailed(self) -> int:
        """Bytes of frames held for replays (at most `tail_bytes`)."""
        return self._tailed

    def _split_entry(self, index: int, keep: int) -> None:
        """Split queue entry `index` after its first `keep` events (at least one), in the queue
        and in its run's pending batches (where it is the oldest not yet taken: the queue and
        each run's pending deque hold the same lists in the same order)."""
        events = self._queue[index]
        keep = max(keep, 1)
        if keep >= len(events):
            return
        head, rest = events[:keep], events[keep:]
        self._queue[index] = head
        self._queue.insert(index + 1, rest)
        run_pending = self._pending_by_run[events[0].host_run_id]
        for position, entry in enumerate(run_pending):
            if entry is events:
                run_pending[position] = head
                run_pending.insert(position + 1, rest)
                break

    def _adapt_commit_limit(self, count: int, seconds: float) -> None:
        """Size the next commits to take about COMMIT_TARGET_SECONDS of CPU at the rate this one
        ran (a moving estimate, so one slow commit does not shrink them at once)."""
        if count < COMMIT_MIN_EVENTS // 2:
            return  # too small to say how fast storage is
        fitting = count * COMMIT_TARGET_SECONDS / max(seconds, 1e-6)
        estimate = int(max(COMMIT_MIN_EVENTS, (self.commit_limit + fitting) / 2))
        # A power of two: storage splits a batch into statements of power-of-two row counts, and
        # each statement waits for the GIL again (up to 5 ms while the loop is busy) when it ends.
        self.commit_limit = min(self.batch_max, 1 << (estimate.bit_length() - 1))

    def _release_flush_waiters(self) -> None:
        still = []
        for target, future in self._flush_waiters:
            if self._committed >= target:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((target, future))
        self._flush_waiters = still

    # -- spool ----------------------------------------------------------------------------------------
    def _open_segment(self) -> None:
        assert self.spool_dir is not None
        self._segment_counter += 1
        # The random part keeps two journals of one process (or a reused pid) apart.
        path = self.spool_dir / f"{os.getpid()}-{self._instance}-{self._segment_counter:06d}.spool"
        self._segments.append(_SpoolSegment(path))

    def _spool(self, blob: bytes) -> None:
        """Append SSE frames (`data:` holds the wire JSON) with one `write()`."""
        segment = self._segments[-1]
        segment.write(blob)
        segment.last_number = self._appended
        if segment.size >= SPOOL_SEGMENT_BYTES:
            self._open_segment()

    def _recover_record(self, line: bytes, path: Path) -> None:
        kind, _, body = line.rstrip(b"\n").partition(b" ")
        handler = self.record_handlers.get(kind.decode("ascii", "replace"))
        if handler is None:
            log.warning("skipped a spooled %r record in %s: nothing handles it", kind[:40], path.name)
            return
        try:
            data = json.loads(body)
        except ValueError:
            return  # a line cut short by the kill: its run's events were never spooled either
        try:
            handler(data)
        except Exception:  # one bad record must not stop the start-up (nor its events' recovery)
            log.exception("could not make a spooled %r record's write again (from %s)", kind[:40], path.name)

    def _drop_committed_segments(self) -> None:
        while len(self._segments) > 1 and self._segments[0].last_number <= self._committed:
            self._segments.popleft().close(remove=True)

    def _recover_spool(self) -> None:
        """Write to storage the events of every spool segment no live journal holds (a killed
        gateway's), then remove the segment. A segment holds SSE frames: each `data:` line is an
        event's wire JSON."""
        assert self.spool_dir is not None
        for path in sorted(self.spool_dir.glob("*.spool")):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another live gateway owns it
                batch: list[Event] = []
                recovered = 0
                with open(fd, "rb", closefd=False) as lines:
                    for raw in lines:
                        if raw.startswith(SPOOL_RECORD):
                            if batch:  # in spool order: what came before it first
                                self.storage.append_events(batch)
                                recovered += len(batch)
                                batch = []
                            self._recover_record(raw[len(SPOOL_RECORD) :], path)
                            continue
                        if not raw.startswith(b"data: "):
                            continue  # a frame's id: / event: line, or the blank line ending it
                        try:
                            batch.append(Event.from_wire(json.loads(raw[6:])))
                        except (ValueError, KeyError):
                            continue  # a line cut short by the kill
                        if len(batch) >= RECOVERY_BATCH:
                            self.storage.append_events(batch)
                            recovered += len(batch)
                            batch = []
                if batch:
                    self.storage.append_events(batch)
                    recovered += len(batch)
                path.unlink()
                if recovered:
                    log.info("recovered %d spooled events from %s", recovered, path.name)
            finally:
                os.close(fd)
