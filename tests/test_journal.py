"""gateway/journal.py and gateway/bus.py with the real peewee SQLite storage: seq assignment, the
terminal rule, reads that merge committed and pending events mid-commit, spool recovery after a
kill, and the per-client buffers (delta merging, replay on overflow, terminal always kept)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.bus import Bus, Subscriber
from agent_gateway.cluster import NotOwner
from agent_gateway.journal import COMMIT_MIN_EVENTS, PUBLISH_EVERY, Journal, JournalFull
from agent_gateway.models import Event, events_of_frames, sse_frames
from agent_gateway.plugins.journal_peewee import PeeweeStorage

WAIT = 10.0
ROOT = Path(__file__).resolve().parent.parent


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[PeeweeStorage]:
    store = PeeweeStorage(sqlite_url(tmp_path / "journal.db"))
    store.open()
    yield store
    store.close()


class Gate:
    """Holds one storage call on a thread until the test releases it."""

    def __init__(self, where: str) -> None:
        self.where = where  # "before" or "after" the real write
        self.entered = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.release.wait(WAIT)


class GatedStorage:
    """Delegates to a real storage; `append_events` can be held before or after the real write
    (`write_gate`), `read_events` before the real read (`read_gate`), on gates the test opens."""

    def __init__(self, inner: PeeweeStorage) -> None:
        self.inner = inner
        self.write_gate: Gate | None = None
        self.read_gate: Gate | None = None
        self.fail_writes = False
        self.reads = 0  # read_events calls

    def hold_writes(self, where: str | None) -> Gate | None:
        """Hold every later `append_events` call on a new gate (None: stop holding)."""
        self.write_gate = Gate(where) if where else None
        return self.write_gate

    def append_events(self, events: Sequence[Event]) -> None:
        if self.fail_writes:
            raise RuntimeError("database is down")
        gate = self.write_gate
        if gate is not None and gate.where == "before":
            gate.hold()
        self.inner.append_events(events)
        if gate is not None and gate.where == "after":
            gate.hold()

    def read_events(self, host_run_id: str, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        self.reads += 1
        gate = self.read_gate
        if gate is not None:
            gate.hold()
        return self.inner.read_events(host_run_id, after_seq, limit)

    def release_all(self) -> None:
        for gate in (self.write_gate, self.read_gate):
            if gate is not None:
                gate.release.set()
        self.write_gate = self.read_gate = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def wait_thread_event(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, WAIT), "timed out waiting for the storage thread"


@pytest.fixture
async def gated(storage: PeeweeStorage, tmp_path: Path) -> AsyncIterator[tuple[Journal, GatedStorage]]:
    store = GatedStorage(storage)
    journal = Journal(store, Bus(), tmp_path / "spool")  # type: ignore[arg-type]
    await journal.start()
    yield journal, store
    store.fail_writes = False
    store.release_all()
    async with asyncio.timeout(WAIT):
        await journal.close()


def seqs(events: Sequence[Event]) -> list[int]:
    return [e.seq for e in events]


# -- seqs and the terminal rule ----------------------------------------------------------------------


async def test_seqs_are_strictly_increasing_per_run(storage: PeeweeStorage, tmp_path: Path) -> None:
    journal = Journal(storage, Bus(), tmp_path / "spool", batch_max=7)
    await journal.start()
    for run in ("run_a", "run_b", "run_c"):
        journal.open_run(run)

    async def writer(run: str, count: int) -> list[int]:
        got = []
        for i in range(count):
            event = await journal.append(run, "message.delta", {"text": f"{run}:{i}"}, "test")
            assert event is not None
            got.append(event.seq)
            if i % 5 == 0:
                await asyncio.sleep(0)  # interleave the writers
        return got

    results = await asyncio.gather(writer("run_a", 60), writer("run_b", 45), writer("run_c", 1))
    async with asyncio.timeout(WAIT):
        await journal.flush()
    for run, got, count in zip(("run_a", "run_b", "run_c"), results, (60, 45, 1), strict=True):
        assert got == list(range(1, count + 1))
        stored = storage.read_events(run)
        assert seqs(stored) == list(range(1, count + 1))
        assert [e.payload["text"] for e in stored] == [f"{run}:{i}" for i in range(count)]
    assert journal.batches >= 2  # the writer committed in groups
    await journal.close()


async def test_a_runtime_that_never_yields_is_published_and_bounded(storage: PeeweeStorage, tmp_path: Path) -> None:
    """`append_nowait` in a loop that never awaits (so no loop tick ends): subscribers still get
    the events as they go, and the burst is refused once `max_pending` events wait for storage."""
    bus = Bus()
    journal = Journal(storage, bus, tmp_path / "spool", max_pending=3000)
    await journal.start()
    journal.open_run("run_n")
    sub = bus.subscribe("run_n", 100_000)
    appended = 0
    with pytest.raises(JournalFull):
        for i in range(10_000):  # no await: neither the writer nor a tick's publish can run
            journal.append_nowait("run_n", "message.delta", {"text": str(i)}, "test")
            appended += 1
            assert journal.appended > appended - PUBLISH_EVERY  # published as it goes
    assert 3000 <= appended < 3000 + PUBLISH_EVERY
    assert seqs(list(sub.buffer)) == list(range(1, appended + 1))
    async with asyncio.timeout(WAIT):
        await journal.append("run_n", "run.completed", {"status": "completed"})  # waits for room
        await journal.flush()
    assert seqs(storage.read_events("run_n")) == list(range(1, appended + 2))
    await journal.close()


async def test_a_burst_is_published_in_larger_batches_and_nothing_waits_after_it(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    bus = Bus()
    journal = Journal(storage, bus, tmp_path / "spool")
    await journal.start()
    journal.open_run("run_b")
    sub = bus.subscribe("run_b", 100_000)
    batches: list[int] = []
    publish_many = bus.publish_many

    def counting(topic: str, events: list[Event], frames: bytes | None = None) -> None:
        batches.append(len(events))
        publish_many(topic, events, frames)

    bus.publish_many = counting  # type: ignore[method-assign]
    for tick in range(10):  # a runtime emitting 100 events per loop iteration
        for i in range(100):
            journal.append_nowait("run_b", "message.delta", {"text": f"{tick}.{i}"}, "test")
        await asyncio.sleep(0)  # the end of a loop iteration, as an agent's pipe read would
    journal.append_nowait("run_b", "message.delta", {"text": "after the burst"}, "test")
    for _ in range(20):  # loop iterations, not time: the lone event goes out within a few
        if len(sub.buffer) == 1001:
            break
        await asyncio.sleep(0)
    assert seqs(list(sub.buffer)) == list(range(1, 1002))
    assert batches[0] == 100 and max(batches) >= 200 and len(batches) <= 6, batches
    await journal.close()


async def test_open_run_continues_after_the_stored_seq(storage: PeeweeStorage, tmp_path: Path) -> None:
    journal = Journal(storage, Bus(), tmp_path / "spool")
    await journal.start()
    journal.open_run("run_x", next_seq=41)
    journal.open_run("run_x", next_seq=3)  # never goes backwards
    event = await journal.append("run_x", "run.started", {})
    assert event is not None and event.seq == 41
    with pytest.raises(KeyError):
        await journal.append("run_unknown", "run.started", {})
    await journal.close()


async def test_nothing_is_appended_after_a_terminal_event(storage: PeeweeStorage, tmp_path: Path) -> None:
    bus = Bus()
    journal = Journal(storage, bus, tmp_path / "spool")
    await journal.start()
    journal.open_run("run_t")
    sub = bus.subscribe("run_t", 100)
    await journal.append("run_t", "message.delta", {"text": "a"})
    terminal = await journal.append("run_t", "run.completed", {"status": "completed"})
    assert terminal is not None and terminal.seq == 2
    assert journal.has_terminal("run_t")
    assert await journal.append("run_t", "message.delta", {"text": "late"}) is None
    assert await journal.append("run_t", "run.failed", {"status": "failed"}) is None
    await journal.flush()
    assert [e.kind for e in storage.read_events("run_t")] == ["message.delta", "run.completed"]
    assert [e.kind for e in sub.take(100)] == ["message.delta", "run.completed"]
    # Reopening a run known to be terminal keeps the rule.
    journal.forget_run("run_t")
    journal.open_run("run_t", next_seq=3, terminal=True)
    assert await journal.append("run_t", "run.interrupted", {}) is None
    await journal.close()
    assert len(storage.read_events("run_t")) == 2


async def test_a_write_behind_refused_for_a_lost_lease_is_dropped_not_retried(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    """A status handed to `write_behind` that storage refuses because this instance lost its
    lease (NotOwner) can never be made here: it goes with the events of that commit, and the
    next commit stores the next ones (it used to stay first in line and refuse every commit)."""
    journal = Journal(storage, Bus(), tmp_path / "spool")
    await journal.start()
    journal.open_run("run_a")
    refused: list[str] = []

    def lost_lease() -> None:
        refused.append("status")
        raise NotOwner("this instance lost its lease")

    journal.write_behind(lost_lease)
    await journal.append("run_a", "message.delta", {"text": "dropped with the refused write"})
    await journal.flush()
    assert refused == ["status"] and journal.fenced == 1
    await journal.append("run_a", "message.delta", {"text": "kept"})
    await journal.flush()
    assert [e.payload["text"] for e in storage.read_events("run_a")] == ["kept"]
    assert refused == ["status"]  # not made again
    await journal.close()


async def _loop_turns(count: int = 3) -> None:
    for _ in range(count):
        await asyncio.sleep(0)  # loop turns: an idle writer that did not gather takes what is there


async def _gathering(storage: PeeweeStorage, tmp_path: Path, texts: tuple[str, ...]) -> Journal:
    """A started journal whose idle writer gathers for 600 s (only what ends a gather ends it
    within a test's bound), with `texts` appended to run_a as deltas, loop turns apart."""
    journal = Journal(storage, Bus(), tmp_path / "spool")
    journal.commit_gather = 600.0
    await journal.start()
    journal.open_run("run_a")
    for text in texts:
        await journal.append("run_a", "message.delta", {"text": text})
        await _loop_turns()
    return journal


async def test_events_soon_after_an_idle_writer_go_in_its_next_commit(storage: PeeweeStorage, tmp_path: Path) -> None:
    """A writer that was idle gathers before it takes a batch: a short run's events, appended
    loop turns apart, go to storage in one commit, not one commit each. A flush ends the gather
    at once (its caller waits for the commit, never for `commit_gather`)."""
    journal = await _gathering(storage, tmp_path, ("running", "answer", "end"))
    assert journal.batches == 0 and storage.read_events("run_a") == []
    async with asyncio.timeout(WAIT):
        await journal.flush()
    assert [e.payload["text"] for e in storage.read_events("run_a")] == ["running", "answer", "end"]
    assert journal.batches == 1
    await journal.close()


async def test_a_run_s_terminal_event_ends_the_gather(storage: PeeweeStorage, tmp_path: Path) -> None:
    """The run that woke an idle writer goes to storage in one commit when it ends, with the
    write waiting for it (its final status), not `commit_gather` later."""
    journal = await _gathering(storage, tmp_path, ("running", "answer"))
    await journal.append("run_a", "run.completed", {"status": "completed"})
    # Without a retry, `write_after` asks for no commit of its own: only the terminal event does.
    async with asyncio.timeout(WAIT):
        kinds = await journal.write_after(lambda: [e.kind for e in storage.read_events("run_a")], retry=False)
    assert kinds == ["message.delta", "message.delta", "run.completed"]
    assert journal.batches == 1
    await journal.close()


async def test_close_during_the_gather_stores_what_waits(storage: PeeweeStorage, tmp_path: Path) -> None:
    """A gateway stopping (SIGTERM) while the writer gathers stores every event at once, and its
    spool is removed only then: nothing waits out the gather, nothing is lost."""
    journal = await _gathering(storage, tmp_path, ("one", "two"))
    async with asyncio.timeout(WAIT):
        await journal.close()
    assert [e.payload["text"] for e in storage.read_events("run_a")] == ["one", "two"]


@pytest.mark.parametrize(
    ("gather", "retry", "events"),
    [
        # A run still streaming when the gather ends: what it appended so far is committed then.
        pytest.param(0.05, False, 1, id="the gather's end"),
        # A write its caller waits for (a run's final status) ends the gather at once: a run's
        # end never waits it out.
        pytest.param(600.0, True, 1, id="a write waited for"),
        # A fast run: its commits begin once a batch's worth waits, so they keep up from its
        # start (a next run's POST waits for the last one's end to be stored).
        pytest.param(600.0, False, COMMIT_MIN_EVENTS, id="a fast run"),
    ],
)
async def test_a_write_after_is_made_with_the_commit_that_ends_the_gather(
    storage: PeeweeStorage, tmp_path: Path, gather: float, retry: bool, events: int
) -> None:
    journal = Journal(storage, Bus(), tmp_path / "spool")
    journal.commit_gather = gather
    await journal.start()
    journal.open_run("run_a")
    for number in range(events):
        await journal.append("run_a", "message.delta", {"text": str(number)})
    async with asyncio.timeout(WAIT):
        stored = await journal.write_after(lambda: len(storage.read_events("run_a")), retry=retry)
    assert stored == events and journal.batches == 1
    await journal.close()


# -- reads while the writer is mid-commit -------------------------------------------------------------


async def test_read_merges_committed_and_pending_with_no_gap_or_duplicate(gated) -> None:
    journal, store = gated
    run = "run_r"
    journal.open_run(run)
    for i in range(1, 6):
        await journal.append(run, "message.delta", {"text": str(i)})
    await journal.flush()
    assert seqs(store.inner.read_events(run)) == [1, 2, 3, 4, 5]

    # 1. The writer holds a batch before writing it: 6..10 exist only in memory.
    gate1 = store.hold_writes("before")
    for i in range(6, 11):
        await journal.append(run, "message.delta", {"text": str(i)})
    await wait_thread_event(gate1.entered)
    assert seqs(store.inner.read_events(run)) == [1, 2, 3, 4, 5]
    assert seqs(await journal.read(run)) == list(range(1, 11))
    assert seqs(await journal.read(run, 3)) == list(range(4, 11))
    assert seqs(await journal.read(run, 0, 7)) == list(range(1, 8))
    assert seqs(await journal.read(run, 5, 2)) == [6, 7]
    assert seqs(await journal.read(run, 8)) == [9, 10]
    assert (await journal.last_event(run)).seq == 10  # type: ignore[union-attr]

    # 2. The next batch (11..15, appended without yielding) is written, but the journal has
    #    not yet seen the commit return: those events are both stored and pending.
    gate2 = store.hold_writes("after")
    gate1.release.set()
    for i in range(11, 16):
        await journal.append(run, "message.delta", {"text": str(i)})
    await wait_thread_event(gate2.entered)
    assert seqs(store.inner.read_events(run)) == list(range(1, 16))
    assert journal.pending == 5
    for after, limit in ((0, None), (12, None), (0, 12), (10, 3), (9, 100)):
        expected = [s for s in range(1, 16) if s > after][:limit]
        assert seqs(await journal.read(run, after, limit)) == expected, (after, limit)

    # 3. A read whose pending snapshot is taken while 16..18 are uncommitted, but whose storage
    #    query runs after they were committed and dropped from the pending list.
    store.hold_writes(None)
    gate2.release.set()
    async with asyncio.timeout(WAIT):
        await journal.flush()
    gate3 = store.hold_writes("before")
    for i in range(16, 19):
        await journal.append(run, "message.delta", {"text": str(i)})
    await wait_thread_event(gate3.entered)
    read_gate = store.read_gate = Gate("before")
    reader = asyncio.create_task(journal.read(run, 14))
    await wait_thread_event(read_gate.entered)
    store.hold_writes(None)
    gate3.release.set()
    async with asyncio.timeout(WAIT):
        await journal.flush()
    assert journal.pending == 0
    store.read_gate = None
    read_gate.release.set()
    async with asyncio.timeout(WAIT):
        got = await reader
    assert seqs(got) == [15, 16, 17, 18]
    assert [e.payload["text"] for e in await journal.read(run)] == [str(i) for i in range(1, 19)]


async def test_an_open_runs_published_frames_are_read_from_memory_within_tail_bytes(gated) -> None:
    journal, store = gated
    journal.batch_max = journal.commit_limit = 7  # commits split the published batches
    run, other = "run_t", "run_o"
    journal.open_run(run)
    journal.open_run(other)
    for i in range(1, 101):  # one published batch: split 7 events at a time by the commits
        journal.append_nowait(run, "message.delta", {"text": str(i)})
    await journal.append(other, "message.delta", {"text": "o"})
    async with asyncio.timeout(WAIT):
        await journal.flush()
    assert seqs(store.inner.read_events(run)) == list(range(1, 101))
    stored_frames = sse_frames(store.inner.read_events(run)) + sse_frames(store.inner.read_events(other))
    assert journal.tailed == len(stored_frames)

    # A late reader (any cursor, any page) gets exactly the frames clients were sent (the same
    # bytes as frames built from storage), with no storage read.
    reads = store.reads
    for after, limit in ((0, 10), (0, 100), (0, 500), (37, 5), (37, 1000), (6, 7), (99, 10)):
        tail = journal.read_frames(run, after, limit)
        expected = store.inner.read_events(run, after, limit)
        assert tail is not None and tail.frames == sse_frames(expected), (after, limit)
        assert (tail.last_seq, tail.count, tail.terminal) == (expected[-1].seq, len(expected), False)
    assert store.reads == reads
    assert journal.read_frames(run, 100, 10) is None  # nothing after the tail: `read` goes on
    assert [e.seq for e in events_of_frames([journal.frames_of(other) or b""])] == [1]

    # A batch that does not fit in tail_bytes ends the run's tail: what it holds still serves,
    # what follows is read from storage, and the ended run is indexed from storage too.
    journal.tail_bytes = journal.tailed + 100  # less than one more batch
    for i in range(101, 131):
        await journal.append(run, "message.delta", {"text": str(i)})
    async with asyncio.timeout(WAIT):
        await journal.flush()
    assert journal.tailed == len(stored_frames)
    tail = journal.read_frames(run, 90, 100)
    assert tail is not None and (tail.last_seq, tail.count) == (100, 10) and store.reads == reads
    assert journal.read_frames(run, 100, 10) is None and journal.frames_of(run) is None
    assert seqs(await journal.read(run, 100)) == list(range(101, 131)) and store.reads == reads + 1

    # The terminal event's frame says so.
    journal.tail_bytes = 1 << 20
    await journal.append(other, "run.completed", {})
    async with asyncio.timeout(WAIT):
        await journal.flush()
    tail = journal.read_frames(other, 0, 100)
    assert tail is not None and (tail.last_seq, tail.count, tail.terminal) == (2, 2, True)

    # A forgotten (ended) run's memory is given back.
    journal.forget_run(run)
    journal.forget_run(other)
    assert journal.tailed == 0 and journal.read_frames(other, 0, 10) is None


# -- the spool ----------------------------------------------------------------------------------------

CRASHING_WRITER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from agent_gateway.bus import Bus
    from agent_gateway.journal import COMMIT_MIN_EVENTS, PUBLISH_EVERY, Journal, JournalFull
    from agent_gateway.plugins.journal_peewee import PeeweeStorage

    class DownStorage(PeeweeStorage):
        def append_events(self, events):
            raise RuntimeError("database is down")

    async def main():
        storage = DownStorage(sys.argv[1])
        storage.open()
        journal = Journal(storage, Bus(), Path(sys.argv[2]))
        await journal.start()
        journal.open_run("run_a")
        journal.open_run("run_b")
        for i in range(300):
            await journal.append("run_a", "message.delta", {"text": f"a{i}", "n": i}, "chat-only")
            if i % 3 == 0:
                await journal.append("run_b", "thought.delta", {"text": f"b{i}"}, "chat-only")
        await journal.append("run_a", "run.completed", {"status": "completed"})
        await asyncio.sleep(0.2)  # let the writer fail a few commits (not synchronisation)
        assert journal.commit_errors >= 1 and journal.pending > 0
        print("spooled", journal.appended, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


async def test_spooled_events_reach_storage_after_a_crash(storage: PeeweeStorage, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    db_url = sqlite_url(tmp_path / "journal.db")
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", CRASHING_WRITER, db_url, str(spool)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.startswith("spooled 401"), proc.stdout + proc.stderr
    assert storage.read_events("run_a") == []
    leftovers = sorted(spool.glob("*.spool"))
    assert leftovers
    # The kill may cut a frame short; recovery skips it.
    with leftovers[-1].open("a") as handle:
        handle.write('id: 000000000000000302\nevent: message.delta\ndata: {"schema":"gateway.run_event.v1","hostRu')

    journal = Journal(storage, Bus(), spool)
    await journal.start()
    stored_a = storage.read_events("run_a")
    stored_b = storage.read_events("run_b")
    assert seqs(stored_a) == list(range(1, 302))
    assert [e.payload["text"] for e in stored_a[:-1]] == [f"a{i}" for i in range(300)]
    assert stored_a[-1].kind == "run.completed"
    assert {e.source for e in stored_a[:-1]} == {"chat-only"}
    assert seqs(stored_b) == list(range(1, 101))
    assert [e.payload["text"] for e in stored_b] == [f"b{i}" for i in range(0, 300, 3)]
    assert all(not path.exists() for path in leftovers)
    await journal.close()
    # Recovering twice is harmless (a replayed batch is skipped by the store).
    again = Journal(storage, Bus(), spool)
    await again.start()
    await again.close()
    assert len(storage.read_events("run_a")) == 301


async def test_a_live_spool_segment_is_not_taken_by_another_journal(storage: PeeweeStorage, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    down = GatedStorage(storage)
    down.fail_writes = True
    first = Journal(down, Bus(), spool)  # type: ignore[arg-type]
    await first.start()
    first.open_run("run_live")
    for i in range(5):
        await first.append("run_live", "message.delta", {"text": str(i)})
    second = Journal(storage, Bus(), spool)
    await second.start()  # must skip the segment `first` still holds
    assert storage.read_events("run_live") == []
    await second.close()
    for _ in range(int(WAIT * 100)):  # until the first journal has tried, and failed, to commit
        if first.commit_errors >= 1:
            break
        await asyncio.sleep(0.01)
    down.fail_writes = False  # storage comes back: the first journal commits its own events
    async with asyncio.timeout(WAIT):
        await first.flush()
    assert first.commit_errors >= 1
    await first.close()
    assert seqs(storage.read_events("run_live")) == [1, 2, 3, 4, 5]
    assert list(spool.glob("*.spool")) == []


# -- the bus --------------------------------------------------------------------------------------------


def ev(seq: int, kind: str = "message.delta", text: str | None = None, **payload: Any) -> Event:
    if text is not None:
        payload["text"] = text
    return Event("run_bus", seq, kind, "chat-only", payload)


def test_subscriber_merges_deltas_when_full_and_keeps_the_text() -> None:
    sub = Subscriber("run_bus", capacity=3)
    sub.offer(ev(1, "run.started"))
    pieces = [f"<{i}>" for i in range(2, 40)]
    for seq, piece in enumerate(pieces, start=2):
        sub.offer(ev(seq, text=piece))
    assert not sub.needs_replay
    assert len(sub.buffer) == 3
    assert sub.merges == len(pieces) - 2
    delivered = sub.take(10)
    assert [e.seq for e in delivered] == [1, 2, 39]  # the merged event carries the last seq
    assert "".join(e.payload["text"] for e in delivered[1:]) == "".join(pieces)
    assert delivered[2].payload["mergedFrom"] == 3
    assert delivered[2].payload["mergedCount"] == len(pieces) - 1
    assert not sub.wakeup.is_set()


def test_a_lagging_subscriber_merges_across_takes_a_terminal_and_a_replay_without_losing_text() -> None:
    """Merged texts are joined when the slot is taken: takes of part of the buffer, a terminal
    event arriving while deltas merge, and an overflow to replay must each see the right text."""
    sub = Subscriber("run_bus", capacity=4)
    taken: list[Event] = []
    seq = 0
    for round_ in range(50):  # a client that takes a little now and then while deltas pour in
        for _ in range(97):
            seq += 1
            sub.offer(ev(seq, text=f"{seq},"))
        taken += sub.take(1 + round_ % 3)
    seq += 1
    sub.offer(ev(seq, "run.completed", status="completed"))  # buffered after the merged slot
    taken += sub.take(100)
    assert not sub.needs_replay and sub.merges > 4000
    assert [e.seq for e in taken] == sorted({e.seq for e in taken})  # in order, no duplicate
    assert taken[-1].kind == "run.completed" and taken[-1].seq == seq
    assert "".join(e.payload["text"] for e in taken[:-1]) == "".join(f"{n}," for n in range(1, seq))
    for event in taken[:-1]:  # each merged event says which seqs it stands for
        first = event.payload.get("mergedFrom", event.seq)
        assert event.payload.get("mergedCount", 1) == event.seq - first + 1
        assert event.payload["text"].startswith(f"{first},") and event.payload["text"].endswith(f"{event.seq},")

    overflow = Subscriber("run_bus", capacity=2)
    for n in range(1, 10):
        overflow.offer(ev(n, text="x"))
    overflow.offer(ev(10, "tool.started", toolCallId="t"))  # not mergeable: replay instead
    assert overflow.needs_replay and overflow.buffer == []
    overflow.needs_replay = False  # the writer replayed; the live feed goes on
    overflow.offer(ev(11, text="a"))
    overflow.offer(ev(12, text="b"))
    overflow.offer(ev(13, text="c"))
    assert [(e.seq, e.payload["text"]) for e in overflow.take(10)] == [(11, "a"), (13, "bc")]


def test_subscriber_switches_to_replay_on_a_non_mergeable_overflow() -> None:
    for overflow in (
        ev(4, "tool.started", toolCallId="t1"),
        ev(4, "thought.delta", text="x"),  # a delta of another kind
        ev(4, text="y", messageId="other"),  # a delta of another message
        ev(4, "permission.requested", requestId="p"),
    ):
        sub = Subscriber("run_bus", capacity=2)
        sub.offer(ev(1, "run.started"))
        sub.offer(ev(2, text="a", messageId="m"))
        assert len(sub.buffer) == 2
        sub.offer(overflow)
        assert sub.needs_replay, overflow.kind
        assert list(sub.buffer) == []
        assert sub.wakeup.is_set()
        sub.offer(ev(5, text="ignored"))  # the writer re-reads these from the journal
        assert list(sub.buffer) == []


def test_terminal_is_always_buffered() -> None:
    sub = Subscriber("run_bus", capacity=2)
    sub.offer(ev(1, "tool.started"))
    sub.offer(ev(2, "tool.completed"))
    sub.offer(ev(3, "run.completed", status="completed"))
    assert not sub.needs_replay
    assert [e.kind for e in sub.take(10)] == ["tool.started", "tool.completed", "run.completed"]
    full_of_deltas = Subscriber("run_bus", capacity=1)
    full_of_deltas.offer(ev(1, text="a"))
    full_of_deltas.offer(ev(2, "run.failed", status="failed"))
    assert [e.kind for e in full_of_deltas.take(10)] == ["message.delta", "run.failed"]


async def test_bus_under_pressure_merges_but_the_journal_keeps_every_event(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    bus = Bus()
    journal = Journal(storage, bus, tmp_path / "spool")
    await journal.start()
    journal.open_run("run_p")
    slow = bus.subscribe("run_p", 4)
    fast = bus.subscribe("run_p", 10_000)
    assert bus.subscriber_count("run_p") == 2
    text = [f"w{i} " for i in range(500)]
    for piece in text:
        await journal.append("run_p", "message.delta", {"text": piece}, "chat-only")
    await journal.append("run_p", "run.completed", {"status": "completed"})
    slow_events = slow.take(100)
    assert len(slow_events) <= 5 and slow.merges > 0 and not slow.needs_replay
    assert "".join(e.payload["text"] for e in slow_events if e.kind == "message.delta") == "".join(text)
    assert slow_events[-1].kind == "run.completed" and slow_events[-1].seq == 501
    assert [e.seq for e in slow_events] == sorted({e.seq for e in slow_events})
    assert [e.seq for e in fast.take(10_000)] == list(range(1, 502))
    assert bus.buffered() == 0
    bus.unsubscribe(slow)
    bus.unsubscribe(fast)
    assert bus.subscriber_count("run_p") == 0
    await journal.flush()
    assert len(await journal.read("run_p")) == 501
    assert json.loads(storage.read_events("run_p", 500)[0].wire_json())["kind"] == "run.completed"
    await journal.close()


# -- bounded group commits and writes between them ---------------------------------------------------


async def test_a_group_commit_is_split_at_its_limit_and_keeps_every_invariant(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    """Publish batches larger than the commit limit are split (each run's events in seq order,
    no gap, no duplicate), reads mid-way merge the stored and pending parts, and every group
    commit stays within the limit."""
    store = GatedStorage(storage)
    sizes: list[int] = []
    real_append = store.append_events

    def counting_append(events: Sequence[Event]) -> None:
        sizes.append(len(events))
        real_append(events)

    store.append_events = counting_append  # type: ignore[method-assign]
    journal = Journal(store, Bus(), tmp_path / "spool", batch_max=300)  # type: ignore[arg-type]
    await journal.start()
    journal.commit_limit = 70  # as if storage were slow: smaller commits
    for run in ("run_a", "run_b"):
        journal.open_run(run)
    gate = store.hold_writes("before")
    # Appended without yielding: one publish batch of 250 for run_a, one of 130 for run_b.
    for i in range(250):
        journal.append_nowait("run_a", "message.delta", {"text": f"a{i}"})
    for i in range(130):
        journal.append_nowait("run_b", "message.delta", {"text": f"b{i}"})
    journal.publish()
    assert gate is not None
    await wait_thread_event(gate.entered)
    # The commit in progress holds run_a's first 70; everything reads back whole meanwhile.
    assert seqs(await journal.read("run_a")) == list(range(1, 251))
    assert seqs(await journal.read("run_a", 100, 10)) == list(range(101, 111))
    assert seqs(await journal.read("run_b")) == list(range(1, 131))
    store.hold_writes(None)
    gate.release.set()
    async with asyncio.timeout(WAIT):
        await journal.flush()
    assert journal.pending == 0
    assert sizes[0] == 70
    assert max(sizes) <= journal.batch_max
    assert sum(sizes) == 380
    for run, count, prefix in (("run_a", 250, "a"), ("run_b", 130, "b")):
        stored = storage.read_events(run)
        assert seqs(stored) == list(range(1, count + 1))
        assert [e.payload["text"] for e in stored] == [f"{prefix}{i}" for i in range(count)]
        assert seqs(await journal.read(run, count - 5)) == list(range(count - 4, count + 1))
    await journal.close()


async def test_the_commit_limit_follows_the_cpu_time_of_commits(storage: PeeweeStorage, tmp_path: Path) -> None:
    journal = Journal(storage, Bus(), tmp_path / "spool", batch_max=5000)
    journal._adapt_commit_limit(1000, 0.1)  # 100 ms for 1,000 events: far over the target
    assert journal.commit_limit < 5000 // 2 + 1000
    for _ in range(20):
        journal._adapt_commit_limit(1000, 0.1)
    assert journal.commit_limit == 256  # never below the floor
    for _ in range(20):
        journal._adapt_commit_limit(1000, 0.0001)  # fast storage: back up to batch_max
    assert journal.commit_limit == 5000
    journal._adapt_commit_limit(10, 1.0)  # too small a commit to judge by
    assert journal.commit_limit == 5000


async def test_a_run_row_write_goes_between_two_group_commits(gated) -> None:
    """`write` waits for the commit in progress and goes before the next one; a commit stuck
    longer than `priority_wait` does not hold it (run rows never wait on a stuck database)."""
    journal, store = gated
    journal.open_run("run_w")
    journal.priority_wait = 0.01
    gate = store.hold_writes("before")
    await journal.append("run_w", "message.delta", {"text": "1"})
    assert gate is not None
    await wait_thread_event(gate.entered)
    # The commit in progress is stuck: the write still happens, once the priority wait is over.
    order: list[str] = []
    async with asyncio.timeout(WAIT):
        await journal.write(order.append, "written while stuck")
    assert order == ["written while stuck"]
    assert journal.pending == 1  # the stuck commit has not finished
    store.hold_writes(None)
    gate.release.set()
    async with asyncio.timeout(WAIT):
        await journal.flush()
    # A commit in progress that ends: the write runs after it, never during it.
    journal.priority_wait = WAIT
    gate = store.hold_writes("after")
    await journal.append("run_w", "message.delta", {"text": "2"})
    assert gate is not None
    await wait_thread_event(gate.entered)
    held = gate

    def row_write() -> None:
        order.append("after the commit" if held.release.is_set() else "during the commit")

    write = asyncio.ensure_future(journal.write(row_write))
    await asyncio.to_thread(lambda: None)  # a worker round trip: the write has a thread meanwhile
    store.hold_writes(None)
    gate.release.set()
    async with asyncio.timeout(WAIT):
        await write
    assert order[-1] == "after the commit"
    assert seqs(store.inner.read_events("run_w")) == [1, 2]


async def test_a_write_after_goes_with_the_commit_of_the_events_before_it(gated) -> None:
    """`write_after` (a run's final status) is made once every event appended before it is
    stored, in the same writer call as the commit that stores the last of them: a reader that
    finds it finds them all; a later event does not hold it back."""
    journal, store = gated
    journal.open_run("run_f")
    await journal.append("run_f", "message.delta", {"text": "1"})
    await journal.append("run_f", "run.completed", {})
    seen: list[tuple[list[int], str]] = []

    def final_status() -> str:
        seen.append((seqs(store.inner.read_events("run_f")), threading.current_thread().name))
        return "stored"

    journal.open_run("run_g")
    write = asyncio.ensure_future(journal.write_after(final_status))
    await journal.append("run_g", "message.delta", {"text": "after it"})
    async with asyncio.timeout(WAIT):
        assert await write == "stored"
    assert seen[0][0] == [1, 2]
    assert seen[0][1].startswith("journal-writer")  # the commit's thread: no trip of its own
    async with asyncio.timeout(WAIT):
        await journal.flush()


async def test_a_write_after_whose_caller_is_cancelled_is_still_made_in_order(gated) -> None:
    """A run's task cancelled while its final status waits (a shutdown): the write stays queued
    and is made, before the writes handed over after it."""
    journal, store = gated
    journal.open_run("run_c")
    gate = store.hold_writes("before")
    await journal.append("run_c", "run.completed", {})
    assert gate is not None
    await wait_thread_event(gate.entered)  # a commit is in flight: the write waits for the next one
    made: list[str] = []
    waiting = asyncio.ensure_future(journal.write_after(lambda: made.append("status")))
    await asyncio.sleep(0)  # (it is queued at once, before its first await)
    waiting.cancel()
    store.hold_writes(None)
    gate.release.set()
    async with asyncio.timeout(WAIT):
        await journal.write_after(lambda: made.append("next"))
    assert made == ["status", "next"] and waiting.cancelled()


async def test_a_failing_write_after_raises_to_its_caller_and_leaves_the_events_stored(gated) -> None:
    journal, store = gated
    journal.open_run("run_e")
    await journal.append("run_e", "message.delta", {"text": "kept"})

    def refused() -> None:
        raise ValueError("refused by storage")

    with pytest.raises(ValueError, match="refused by storage"):
        async with asyncio.timeout(WAIT):
            await journal.write_after(refused)
    assert seqs(store.inner.read_events("run_e")) == [1]
    async with asyncio.timeout(WAIT):  # the writer goes on
        assert await journal.write_after(lambda: "next") == "next"


async def test_a_write_after_waits_out_a_failing_commit_and_goes_with_the_one_that_succeeds(gated) -> None:
    """Storage down when a run ends: its status is not written before its events are stored,
    and is written (once) with the commit that stores them when storage is back."""
    journal, store = gated
    journal.open_run("run_d")
    store.fail_writes = True
    await journal.append("run_d", "run.completed", {})
    made: list[list[int]] = []
    write = asyncio.ensure_future(journal.write_after(lambda: made.append(seqs(store.inner.read_events("run_d")))))
    async with asyncio.timeout(WAIT):
        while journal.commit_errors < 2:  # two failed attempts (the writer retries with a backoff)
            await asyncio.wait({write}, timeout=0.02)
    assert not write.done() and made == []
    store.fail_writes = False
    async with asyncio.timeout(WAIT):
        await write
    assert made == [[1]]


async def test_a_write_after_without_retry_fails_with_a_failing_commit_unmade(gated) -> None:
    """`retry=False` (the session index, which a later change writes again): storage down fails
    the write with the commit's error at once, not made, while the events wait for storage."""
    journal, store = gated
    journal.open_run("run_n")
    store.fail_writes = True
    await journal.append("run_n", "message.delta", {"text": "waits"})
    made: list[str] = []
    with pytest.raises(RuntimeError, match="database is down"):
        async with asyncio.timeout(WAIT):
            await journal.write_after(lambda: made.append("index"), retry=False)
    assert made == [] and journal.pending == 1
    store.fail_writes = False
    async with asyncio.timeout(WAIT):
        await journal.flush()
    assert made == [] and seqs(store.inner.read_events("run_n")) == [1]


async def test_close_lets_a_write_in_flight_end_without_blocking_the_loop(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    """A write the writer is making when the journal closes (a run's index, handed over as the
    gateway stops) ends, and its caller gets its result; the loop keeps running meanwhile (a
    storage reached through it, as a test's database proxy is, needs it to answer)."""
    journal = Journal(storage, Bus(), tmp_path / "spool")
    await journal.start()
    loop = asyncio.get_running_loop()
    entered, answered = threading.Event(), threading.Event()

    def needs_the_loop() -> str:
        entered.set()
        loop.call_soon_threadsafe(answered.set)
        assert answered.wait(WAIT)
        return "made"

    write = asyncio.ensure_future(journal.write_after(needs_the_loop))
    await wait_thread_event(entered)
    async with asyncio.timeout(WAIT):
        await journal.close()
        assert await write == "made"


async def test_spooled_records_are_written_again_in_spool_order_and_a_bad_one_is_skipped(
    storage: PeeweeStorage, tmp_path: Path
) -> None:
    """A `write_behind` record in a dead gateway's spool goes to its kind's handler before the
    events spooled after it; a record of an unknown kind, one cut short by the kill and one its
    handler fails on are logged and skipped, and the events around them are still recovered."""
    spool = tmp_path / "spool"
    spool.mkdir()
    frames = [sse_frames([Event("run_r", seq, "message.delta", "gateway", {"text": f"t{seq}"})]) for seq in (1, 2, 3)]
    (spool / "999999-dead-000001.spool").write_bytes(
        frames[0]
        + b'record: row {"id": "first"}\n'
        + b'record: nobody {"id": "x"}\n'
        + b'record: row {"id": "fails"}\n'
        + frames[1]
        + b'record: row {"id": "cut sho'
        + b"\n"
        + frames[2]
    )
    seen: list[tuple[str, int]] = []

    def handle_row(data: dict[str, Any]) -> None:
        if data["id"] == "fails":
            raise ValueError("a record this version cannot read")
        seen.append((data["id"], len(storage.read_events("run_r"))))

    journal = Journal(storage, Bus(), spool)
    journal.record_handlers["row"] = handle_row
    await journal.start()
    await journal.close()
    assert seen == [("first", 1)]  # after the event spooled before it, before the ones after
    assert seqs(storage.read_events("run_r")) == [1, 2, 3]
    assert not (spool / "999999-dead-000001.spool").exists()
