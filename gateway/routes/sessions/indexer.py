"""The session index, kept current by :class:`SessionIndexer`: a run listener feeding one worker
task (so updates of a session are applied in the order they happened). Every status change updates
the session's row; a run's end stores its digest (from the ``transcript`` projection) for counts and
full-text search. Reads wait for it (:meth:`SessionIndexer.settle`).

The digest of a run this process ran is folded as its events are published (:class:`RunFold`, a
journal hook), so a run's end only joins its answer and writes: re-reading and folding a long
run's journal at its end held the GIL on a worker for 0.4-0.7 s per 100,000 events, and every
request meanwhile waited for it. A run whose events this process did not all see (ended at
start-up, taken over, or its fold dropped) is folded from its journal as before."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from agent_gateway.auth import Auth
from agent_gateway.errors import ApiError
from agent_gateway.journal import Journal
from agent_gateway.models import TERMINAL_KINDS, Event, Run, events_of_frames
from agent_gateway.runs import RunManager
from agent_gateway.storage import Storage
from agent_gateway.transcript import (
    REPLAY_SOURCE,
    apply_op,
    empty_transcript,
    project_transcript,
    run_transcript,
    transcript_ops,
)

log = logging.getLogger(__name__)

# How long the session indexer gathers run changes before it indexes them (see `_work`).
INDEX_GATHER_SECONDS = 0.005
INDEX_METHODS = ("touch_session_index", "put_run_digest", "list_session_index", "search_session_index")
# A fold keeps its answer's deltas as parts, joined into one chunk every CHUNK_PARTS (each character
# is copied once more): a long run holds a few large strings, not one object per delta.
CHUNK_PARTS = 4096
# Folds of runs not ended yet, at most (the oldest is dropped: its run is folded from its journal).
MAX_FOLDS = 10_000
# A digest carries at most this many characters of a run's question and of its answer: the session
# index searches the start of each run (storage cuts its joined text shorter still). A fold keeps no
# more: a long run's whole answer (1.6 MB for 100,000 deltas), joined at its end, took 1.4-3.6 ms
# of the indexer's worker time, and its deltas stayed in memory until then.
DIGEST_TEXT_CHARS = 100_000
# An ended run of at most this many events, whose answer holds at most this many characters, is
# indexed on the journal's writer, after its next commit (`_small_fold`); a longer one on a
# storage worker.
WRITER_INDEX_EVENTS = 1024
WRITER_INDEX_CHARS = 16_384

# -- the indexer -------------------------------------------------------------------------------------


def run_digest(run: Run, transcript: dict[str, Any]) -> dict[str, Any]:
    """What an ended run contributes to its session's index, from its transcript."""
    tools = [str(card.get("tool") or card.get("title") or card.get("kind") or "") for card in transcript["tools"]]
    files: list[str] = [str(change["path"]) for change in transcript["files"]]
    for citation in transcript["citations"]:
        files.extend(str(citation[key]) for key in ("path", "filePath", "url") if citation.get(key))
    for card in transcript["tools"]:
        for location in card.get("locations") or ():
            if isinstance(location, dict) and location.get("path"):
                files.append(str(location["path"]))
    answer = transcript["answer"]["text"][:DIGEST_TEXT_CHARS]
    question = (transcript["question"] or "")[:DIGEST_TEXT_CHARS]
    return {
        "host_run_id": run.host_run_id,
        "actor_id": run.actor_id,
        "session_id": run.session_id,
        "created_at": run.created_at,
        "status": run.status,
        "question": question,
        "answer": answer,
        "tools": " ".join(t for t in tools if t),
        "files": "\n".join(dict.fromkeys(files)),
        "message_count": (1 if question else 0) + (1 if answer else 0),
        "tool_count": len(transcript["tools"]),
        "mode": transcript["sessionMode"],
        "agent_session_id": transcript["agentSessionId"],
    }


class RunFold:
    """What a run's digest needs of its transcript, folded as the run's events are published (the
    journal's ``on_publish``): the same result as :func:`project_transcript` of its whole journal
    for every field :func:`run_digest` reads. A delta costs a type check and, until the answer
    holds DIGEST_TEXT_CHARS, an append; thoughts, which the digest does not show, are skipped."""

    __slots__ = ("chunks", "ended", "kept", "next_seq", "parts", "state")

    def __init__(self, host_run_id: str) -> None:
        self.state = empty_transcript(host_run_id)
        self.chunks: list[str] = []
        self.parts: list[str] = []
        self.kept = 0  # characters in chunks and parts
        self.next_seq = 1
        self.ended = False  # its terminal event is folded: the fold is the whole run

    def add(self, events: list[Event]) -> bool:
        """Fold the run's next published events; False if they do not follow the last ones folded
        (then this fold is not the run's journal and must not be used)."""
        if events[0].seq != self.next_seq:
            return False
        parts, state, kept = self.parts, self.state, self.kept
        for event in events:
            kind = event.kind
            if (kind == "message.delta" or kind == "thought.delta") and event.source != REPLAY_SOURCE:
                if kind == "message.delta" and kept < DIGEST_TEXT_CHARS:
                    text = event.payload.get("text")
                    if isinstance(text, str) and text:
                        parts.append(text)
                        kept += len(text)
                continue
            for op in transcript_ops(event):
                name = op["op"]
                if name == "answer.final":
                    if op["text"] is not None:  # the final text replaces the deltas
                        self.chunks.clear()
                        parts.clear()
                        parts.append(op["text"])
                        kept = len(op["text"])
                    state["answer"]["final"] = True
                elif name != "thought.append":
                    apply_op(state, op)
            if kind in TERMINAL_KINDS:
                self.ended = True
        self.kept = kept
        self.next_seq = events[-1].seq + 1
        if len(parts) >= CHUNK_PARTS:
            self.chunks.append("".join(parts))
            parts.clear()
        return True

    def transcript(self, run: Run) -> dict[str, Any]:
        """The transcript :func:`run_digest` takes (thoughts left empty)."""
        state = self.state
        state["question"] = run_transcript(run)["question"]
        state["agentId"] = state["agentId"] or run.agent_id
        state["answer"]["text"] = "".join(self.chunks) + "".join(self.parts)
        return state


def _small_fold(source: RunFold | bytes | None) -> bool:
    """An ended run's fold short enough to index on the journal's writer. A long run's index
    writes cost the writer more than a storage worker (1.5-1.9 against 1.1-1.2 ms for a run of
    100,000 events, `bench/bench_run_end.py`), where its trip is nothing beside the run."""
    return isinstance(source, RunFold) and source.next_seq <= WRITER_INDEX_EVENTS and source.kept <= WRITER_INDEX_CHARS


@dataclass(frozen=True)
class SessionsDeps:
    """What the sessions feature uses (its index, its routes)."""

    auth: Auth
    storage: Storage
    journal: Journal
    runs: RunManager
    runtimes: Mapping[str, Any]
    executor: Executor


class SessionIndexer:
    """Keeps the session index current: a run listener feeding one worker task (so updates of a
    session are applied in the order they happened). Reads wait for it (:meth:`settle`), so a
    client that saw a run end finds it listed and searchable."""

    def __init__(self, deps: SessionsDeps) -> None:
        self.deps = deps
        self.enabled = all(callable(getattr(deps.storage, name, None)) for name in INDEX_METHODS)
        # Run snapshots to index, each with an ended run's fold (`RunFold`), or the SSE frames of
        # its events if the journal still held them all when it ended (else its events are read
        # from storage).
        self.queue: asyncio.Queue[tuple[Run, RunFold | bytes | None]] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.backfilled = False
        self.stopped = False
        self.settling = 0  # requests waiting in `settle`: their index writes do not wait for a run
        # The folds of runs whose every event this process published, from their first.
        self.folds: dict[str, RunFold] = {}
        if self.enabled:
            deps.journal.on_publish.append(self._fold)

    def _fold(self, host_run_id: str, events: list[Event]) -> None:
        """The journal's ``on_publish``: fold a run's published batch into its digest."""
        folds = self.folds
        try:
            fold = folds.get(host_run_id)
            if fold is None:
                if events[0].seq != 1 or self.stopped:
                    return  # not seen from its start: folded from its journal at its end
                if folds and len(folds) >= MAX_FOLDS:
                    del folds[next(iter(folds))]
                fold = folds[host_run_id] = RunFold(host_run_id)
            kept = fold.add(events)
        except Exception:  # never in the way of publishing: the run is folded at its end instead
            log.exception("could not fold run %s for its session index", host_run_id)
            kept = False
        if not kept:
            folds.pop(host_run_id, None)

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.deps.executor, lambda: fn(*args, **kwargs))

    def on_run(self, run: Run) -> None:
        if not self.enabled or self.stopped:
            return  # after shutdown: an ended run is indexed by the next process (settle)
        source: RunFold | bytes | None = None
        if run.is_terminal:
            fold = self.folds.pop(run.host_run_id, None)
            if fold is not None and fold.ended:
                source = fold
            else:
                # The ended run's events from the frames in memory: a storage read of a long run
                # holds the GIL on a worker for every row it turns into an event (0.2 s for 20,000).
                source = self.deps.journal.frames_of(run.host_run_id)
        self.queue.put_nowait((replace(run, request=dict(run.request)), source))  # a snapshot: the run changes on
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._work(), name="session-indexer")

    async def _work(self) -> None:
        while True:
            batch = [await self.queue.get()]
            try:
                # A short run's changes (running, its session mode, its end) come milliseconds
                # apart: gathered, they cost one worker call instead of one each.
                await asyncio.sleep(INDEX_GATHER_SECONDS)
                while not self.queue.empty():  # what came meanwhile: indexed in the same worker call
                    batch.append(self.queue.get_nowait())
                if all(_small_fold(source) or not run.is_terminal for run, source in batch):
                    # Short runs, nothing to read or parse: the journal's writer makes it after its
                    # next commit (the next run's, when runs follow each other), not a trip of its
                    # own. A commit that fails fails it, as a worker call would.
                    if self.settling:
                        self.deps.journal.commit_soon()
                    await self.deps.journal.write_after(functools.partial(self._index_on_writer, batch), retry=False)
                else:
                    await self._db(self._index_batch, batch)
            except Exception:  # storage refused it: a later change of the same run indexes it
                log.exception("could not index %d run change(s) in their sessions", len(batch))
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def index(self, run: Run, frames: bytes | None = None) -> None:
        await self._db(self._index_batch, [(run, frames)])

    def _index_batch(self, batch: list[tuple[Run, RunFold | bytes | None]]) -> None:
        """Index run snapshots, oldest first, in one worker call (a round trip per snapshot cost
        each short run several). An ended run's events, if it has no fold, are read or parsed
        here, outside the journal's storage lock; the writes then take turns with the journal's
        group commits (`Journal.write_now`), not collide in the database's lock, where the loser
        sleeps in its busy handler."""
        writes = self._index_writes(batch)
        self.deps.journal.write_now(functools.partial(self._make_writes, writes))

    def _index_on_writer(self, batch: list[tuple[Run, RunFold | bytes | None]]) -> None:
        """`_index_batch` on the journal's writer, under its storage lock (`Journal.write_after`):
        for batches of running runs and short ended ones with their folds (`_small_fold`)."""
        self._make_writes(self._index_writes(batch))

    @staticmethod
    def _make_writes(writes: list[tuple[Run, Callable[[], Any]]]) -> None:
        for run, write in writes:
            try:
                write()
            except Exception:  # one run's failure leaves the others indexed
                log.exception("could not index run %s in its session", run.host_run_id)

    def _index_writes(self, batch: list[tuple[Run, RunFold | bytes | None]]) -> list[tuple[Run, Callable[[], Any]]]:
        """The storage writes that index run snapshots. Only a run's last snapshot is written: the
        earlier ones of the same run would be overwritten by it."""
        latest: dict[str, tuple[Run, RunFold | bytes | None]] = {}
        for run, frames in batch:
            # Each run's last snapshot, in the order the runs first appear: a session's first run
            # creates its index row (and gives it its title) even when the next one started before
            # the first one's end was seen.
            latest[run.host_run_id] = (run, frames)
        storage = self.deps.storage
        writes: list[tuple[Run, Callable[[], Any]]] = []
        for run, frames in latest.values():
            writes.append((run, functools.partial(storage.touch_session_index, run)))
            if not run.is_terminal:
                continue
            try:
                if isinstance(frames, RunFold):
                    transcript = frames.transcript(run)
                else:
                    events = storage.read_events(run.host_run_id) if frames is None else events_of_frames([frames])
                    transcript = project_transcript(events, run_transcript(run))
                digest = run_digest(run, transcript)
            except Exception:
                log.exception("could not index run %s in its session", run.host_run_id)
                continue
            writes.append((run, functools.partial(storage.put_run_digest, digest)))
        return writes

    async def settle(self) -> None:
        """Wait until every run change seen so far is indexed; index ended runs that never were
        (once per process: e.g. runs marked interrupted at start-up)."""
        if not self.enabled:
            raise ApiError(501, "not_supported", "this storage backend keeps no session index")
        self.settling += 1
        self.deps.journal.commit_soon()  # an index write already waiting for the next commit
        try:
            await self._settle()
        finally:
            self.settling -= 1

    async def _settle(self) -> None:
        # A run whose terminal event is out (a client may have seen it) is only storing its end:
        # wait for it, so its digest is in the queue.
        for run in self.deps.runs.active_runs():
            if self.deps.journal.has_terminal(run.host_run_id):
                await self.deps.runs.wait(run.host_run_id)
        if not self.backfilled:
            # What is queued first: a run that just ended has no digest until its own is written,
            # and would be indexed twice, the second time from its whole journal in storage.
            if self.worker is not None and not self.worker.done():
                await self.queue.join()
            self.backfilled = True
            for run in await self._db(self.deps.storage.runs_without_digest, 10_000):
                self.on_run(run)
        if self.worker is not None and not self.worker.done():
            await self.queue.join()

    async def stop(self, app: web.Application) -> None:
        self.stopped = True
        self.folds.clear()
        if self.worker is not None:
            self.worker.cancel()
