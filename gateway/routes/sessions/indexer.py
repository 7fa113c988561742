"""The session index, kept current by :class:`SessionIndexer`: a run listener feeding one worker
task (so updates of a session are applied in the order they happened). Every status change updates
the session's row; a run's end stores its digest (from the ``transcript`` projection) for counts and
full-text search. Reads wait for it (:meth:`SessionIndexer.settle`)."""

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
from agent_gateway.models import Run, events_of_frames
from agent_gateway.runs import RunManager
from agent_gateway.storage import Storage
from agent_gateway.transcript import project_transcript, run_transcript

log = logging.getLogger(__name__)

# How long the session indexer gathers run changes before it indexes them (see `_work`).
INDEX_GATHER_SECONDS = 0.005
INDEX_METHODS = ("touch_session_index", "put_run_digest", "list_session_index", "search_session_index")

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
    answer = transcript["answer"]["text"]
    question = transcript["question"] or ""
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
        # Run snapshots to index, each with the SSE frames of an ended run's events if the journal
        # still held them all when it ended (else its events are read from storage).
        self.queue: asyncio.Queue[tuple[Run, bytes | None]] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.backfilled = False
        self.stopped = False

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.deps.executor, lambda: fn(*args, **kwargs))

    def on_run(self, run: Run) -> None:
        if not self.enabled or self.stopped:
            return  # after shutdown: an ended run is indexed by the next process (settle)
        # The ended run's events from the frames in memory: a storage read of a long run holds the
        # GIL on a worker for every row it turns into an event (0.2 s for 20,000), slowing the loop.
        frames = self.deps.journal.frames_of(run.host_run_id) if run.is_terminal else None
        self.queue.put_nowait((replace(run, request=dict(run.request)), frames))  # a snapshot: the run changes on
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
                await self._db(self._index_batch, batch)
            except Exception:  # storage refused it: a later change of the same run indexes it
                log.exception("could not index %d run change(s) in their sessions", len(batch))
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def index(self, run: Run, frames: bytes | None = None) -> None:
        await self._db(self._index_batch, [(run, frames)])

    def _index_batch(self, batch: list[tuple[Run, bytes | None]]) -> None:
        """Index run snapshots, oldest first, in one worker call (a round trip per snapshot cost
        each short run several). Only a run's last snapshot is written: the earlier ones of the
        same run would be overwritten by it. An ended run's events are folded here, outside the
        journal's storage lock (a long run's fold takes milliseconds); the writes then take turns
        with the journal's group commits (`Journal.write_now`), not collide in the database's lock,
        where the loser sleeps in its busy handler."""
        latest: dict[str, tuple[Run, bytes | None]] = {}
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
                events = storage.read_events(run.host_run_id) if frames is None else events_of_frames([frames])
                digest = run_digest(run, project_transcript(events, run_transcript(run)))
            except Exception:
                log.exception("could not index run %s in its session", run.host_run_id)
                continue
            writes.append((run, functools.partial(storage.put_run_digest, digest)))

        def write_all() -> None:
            for run, write in writes:
                try:
                    write()
                except Exception:  # one run's failure leaves the others indexed
                    log.exception("could not index run %s in its session", run.host_run_id)

        self.deps.journal.write_now(write_all)

    async def settle(self) -> None:
        """Wait until every run change seen so far is indexed; index ended runs that never were
        (once per process: e.g. runs marked interrupted at start-up)."""
        if not self.enabled:
            raise ApiError(501, "not_supported", "this storage backend keeps no session index")
        # A run whose terminal event is out (a client may have seen it) is only storing its end:
        # wait for it, so its digest is in the queue.
        for run in self.deps.runs.active_runs():
            if self.deps.journal.has_terminal(run.host_run_id):
                await self.deps.runs.wait(run.host_run_id)
        if not self.backfilled:
            self.backfilled = True
            for run in await self._db(self.deps.storage.runs_without_digest, 10_000):
                self.on_run(run)
        if self.worker is not None and not self.worker.done():
            await self.queue.join()

    async def stop(self, app: web.Application) -> None:
        self.stopped = True
        if self.worker is not None:
            self.worker.cancel()
