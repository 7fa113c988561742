"""The workspace watcher: file changes under the allowed roots in use become `files.changed` events.

When a run of a workspace starts, the watcher watches (watchfiles' ``awatch``: inotify, never a
polling loop) the allowed roots of that workspace's active runs; when no run of the workspace
has been active for ``linger_seconds`` it stops. Every batch of changes becomes

    files.changed {workspaceId, changes: [{path, change: added|modified|deleted, cause: "external"}]}

on the journal of each active run of the workspace (only the changes inside that run's allowed
roots) and on the workspace's own topic ``ws:<workspaceId>`` (all of them), which
``GET /v1/workspaces/{workspaceId}/events`` streams like a run (``Last-Event-ID`` resumes it;
the topic has no terminal event).

A change made through the tool facade is not the watcher's to report: the facade puts it on the
calling run's journal itself (``cause: "tool"``, its ``receiptId``, before the call returns, so
before that run ends) and tells the watcher, as a write observer, before the write starts and after
it ends. The watcher then puts it on the workspace topic (with its receipt) and drops its inotify
echo — whenever that arrives, so a write never reaches another run, nor a run that started after
it. A batch waits while a facade write to one of its paths is in flight, so the echo is recognised
by the content the write left (sha256), not by timing. Runs hear from the watcher only of changes
no tool made (``cause: "external"``: the agent's own writes, an editor, ...). A change whose
content is what was last reported for that path (a rename, a second inotify event of one write)
is not reported again. The facade's own temporary files (``.ag-tmp-*``) are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from watchfiles import Change, awatch

from agent_gateway.models import Run
from agent_gateway.paths import allowed_roots_of

if TYPE_CHECKING:
    from agent_gateway.journal import Journal
    from agent_gateway.tools import ToolCall

log = logging.getLogger("agent_gateway.watcher")

TOPIC_PREFIX = "ws:"
TMP_PREFIX = ".ag-tmp-"
HASH_MAX_BYTES = 64 * 1024 * 1024
# Longest a batch waits for facade writes in flight on its paths (a write is one atomic rename;
# this bounds a stuck handler, it is not a timing guess).
PENDING_WAIT_SECONDS = 10.0
ACTIVE = frozenset({"pending", "queued", "running", "awaiting_permission"})


def topic_for(workspace_id: str) -> str:
    return TOPIC_PREFIX + workspace_id


def _probe(paths: Iterable[str]) -> dict[str, tuple[str | None, bool, bool]]:
    """Per path: (sha256 or None, exists, is a directory). Runs on a worker thread."""
    return {p: (_sha256(p), os.path.lexists(p), os.path.isdir(p)) for p in paths}


def _sha256(path: str) -> str | None:
    """The file's sha256, or None when it is gone, not a regular file, or too large to hash."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > HASH_MAX_BYTES:
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()
    except OSError:
        return None


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


@dataclass
class FacadeWrite:
    sha256: str
    receipt_id: str
    expires: float


@dataclass
class _Watch:
    workspace_id: str
    roots: tuple[str, ...]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Watcher:
    """Construct once per app (``Gateway.__init__``), ``await start()`` after the journal started,
    ``await stop()`` before it closes. The gateway makes it a write observer of the tool facade
    (``facade_write_started`` / ``facade_write_ended``) and a listener of run changes
    (:meth:`run_changed`)."""

    def __init__(
        self,
        journal: Journal,
        workspace_roots: Mapping[str, Path],
        executor: Executor,
        active_runs: Callable[[], list[Run]],
        *,
        linger_seconds: float = 30.0,
        facade_window_seconds: float = 30.0,
        debounce_ms: int = 400,
        step_ms: int = 50,
    ) -> None:
        self.journal = journal
        self.executor = executor
        self._all_active_runs = active_runs
        self.workspace_roots: dict[str, Path] = dict(workspace_roots)
        self._real_roots = {ws: os.path.realpath(path) for ws, path in self.workspace_roots.items()}
        self.linger = linger_seconds
        self.facade_window = facade_window_seconds
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self._watches: dict[str, _Watch] = {}
        self._stop_timers: dict[str, asyncio.TimerHandle] = {}
        self._facade: dict[str, list[FacadeWrite]] = {}
        # Facade writes in flight, by absolute path (a batch touching one waits for its end).
        self._pending: dict[str, int] = {}
        self._writes_ended = asyncio.Event()
        self._last_sha: dict[str, str | None] = {}
        self._started = False
        self._rewatched = asyncio.Event()
        self.batches = 0

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open every configured workspace's topic after its last stored event."""
        for workspace_id in self.workspace_roots:
            topic = topic_for(workspace_id)
            last = await self.journal.last_event(topic)
            self.journal.open_run(topic, next_seq=(last.seq + 1) if last else 1)
        self._started = True

    async def stop(self) -> None:
        self._started = False
        for timer in self._stop_timers.values():
            timer.cancel()
        self._stop_timers.clear()
        for workspace_id in list(self._watches):
            await self._unwatch(workspace_id)

    def knows(self, workspace_id: str) -> bool:
        return workspace_id in self.workspace_roots

    def watching(self, workspace_id: str) -> tuple[str, ...]:
        """The directories watched for a workspace now (empty: not watched)."""
        watch = self._watches.get(workspace_id)
        return watch.roots if watch is not None else ()

    async def ready(self, workspace_id: str, host_run_id: str | None = None, timeout: float = 10.0) -> None:
        """Wait until the workspace is watched (inotify watches in place) — with ``host_run_id``,
        until that run is active and every allowed root of it is covered."""
        async with asyncio.timeout(timeout):
            while True:
                self._rewatched.clear()
                watch = self._watches.get(workspace_id)
                if watch is not None and self._covers(watch, workspace_id, host_run_id):
                    await watch.ready.wait()
                    if self._watches.get(workspace_id) is watch:
                        return
                    continue
                await self._rewatched.wait()

    def _covers(self, watch: _Watch, workspace_id: str, host_run_id: str | None) -> bool:
        if host_run_id is None:
            return True
        run = next((r for r in self._active_runs(workspace_id) if r.host_run_id == host_run_id), None)
        if run is None or run.status not in ("running", "awaiting_permission"):
            return False
        return all(any(_inside(root, w) for w in watch.roots) for root in self._run_roots(run))

    # -- runs -----------------------------------------------------------------------------------------
    def _active_runs(self, workspace_id: str) -> list[Run]:
        return [r for r in self._all_active_runs() if r.workspace_id == workspace_id and r.status in ACTIVE]

    def _run_roots(self, run: Run) -> list[str]:
        base = self.workspace_roots.get(run.workspace_id)
        if base is None:
            return []
        roots = (run.request.get("context") or {}).get("allowedRoots") or []
        return [str(r.absolute) for r in allowed_roots_of(base, [x for x in roots if isinstance(x, str)]) if r.absolute]

    def run_changed(self, run: Run) -> None:
        if not self._started or run.workspace_id not in self.workspace_roots:
            return
        workspace_id = run.workspace_id
        active = self._active_runs(workspace_id)
        if active:
            timer = self._stop_timers.pop(workspace_id, None)
            if timer is not None:
                timer.cancel()
            roots = set(self.watching(workspace_id))
            for other in active:
                roots.update(self._run_roots(other))
            wanted = tuple(sorted(_outermost(roots)))
            if wanted and wanted != self.watching(workspace_id):
                self._rewatch(workspace_id, wanted)
        elif workspace_id in self._watches and workspace_id not in self._stop_timers:
            loop = asyncio.get_running_loop()
            self._stop_timers[workspace_id] = loop.call_later(self.linger, self._linger_over, workspace_id)
        self._rewatched.set()

    def _linger_over(self, workspace_id: str) -> None:
        self._stop_timers.pop(workspace_id, None)
        if not self._active_runs(workspace_id):
            task = asyncio.get_running_loop().create_task(self._unwatch(workspace_id))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _rewatch(self, workspace_id: str, roots: tuple[str, ...]) -> None:
        old = self._watches.pop(workspace_id, None)
        if old is not None:
            old.stop.set()
        watch = _Watch(workspace_id, roots)
        self._watches[workspace_id] = watch
        loop = asyncio.get_running_loop()
        watch.task = loop.create_task(self._watch(watch), name=f"watch-{workspace_id}")
        # The task's first step creates the inotify watches synchronously (watchfiles' RustNotify);
        # callbacks run in order, so `ready` is set right after it.
        loop.call_soon(watch.ready.set)
        loop.call_soon(self._rewatched.set)

    async def _unwatch(self, workspace_id: str) -> None:
        watch = self._watches.pop(workspace_id, None)
        if watch is None:
            return
        watch.stop.set()
        if watch.task is not None:
            try:
                async with asyncio.timeout(5.0):
                    await watch.task
            except (TimeoutError, asyncio.CancelledError):
                watch.task.cancel()
            except Exception:
                log.exception("watch of %s failed", workspace_id)

    async def _watch(self, watch: _Watch) -> None:
        try:
            async for changes in awatch(
                *watch.roots,
                stop_event=watch.stop,
                debounce=self.debounce_ms,
                step=self.step_ms,
                recursive=True,
                force_polling=False,
                ignore_permission_denied=True,
            ):
                try:
                    await self._handle(watch.workspace_id, changes)
                except Exception:
                    log.exception("could not report changes in %s", watch.workspace_id)
        except Exception:
            log.exception("watching %s (%s) failed", watch.workspace_id, ", ".join(watch.roots))

    # -- facade writes (the tool facade's write observer) --------------------------------------------
    def write_started(self, call: ToolCall) -> None:
        primary = call.path
        if primary is None:
            return
        absolute = str(primary.absolute)
        self._pending[absolute] = self._pending.get(absolute, 0) + 1

    async def write_ended(self, call: ToolCall, change: dict[str, Any] | None) -> None:
        primary = call.path
        if primary is None:
            return
        absolute = str(primary.absolute)
        try:
            after = call.after_version
            if change is not None and after is not None:
                self.record_facade_write(absolute, after.sha256, str(change["receiptId"]))
                self._last_sha[absolute] = after.sha256
                await self._publish_topic(call.scope.workspace_id, [change])
        finally:
            left = self._pending.get(absolute, 0) - 1
            if left > 0:
                self._pending[absolute] = left
            else:
                self._pending.pop(absolute, None)
            self._writes_ended.set()

    def record_facade_write(self, absolute: str, sha256: str, receipt_id: str) -> None:
        now = time.monotonic()
        entries = [e for e in self._facade.get(absolute, []) if e.expires > now]
        entries.append(FacadeWrite(sha256, receipt_id, now + self.facade_window))
        self._facade[absolute] = entries[-8:]
        for path in [p for p, es in self._facade.items() if all(e.expires <= now for e in es)]:
            del self._facade[path]

    def _facade_match(self, absolute: str, sha: str | None) -> FacadeWrite | None:
        if sha is None:
            return None
        now = time.monotonic()
        for entry in reversed(self._facade.get(absolute, [])):
            if entry.expires > now and entry.sha256 == sha:
                return entry
        return None

    async def _probe_settled(self, paths: list[str]) -> dict[str, tuple[str | None, bool, bool]]:
        """Probe ``paths`` when no facade write to any of them is in flight (again when one started
        during the probe): what the probe saw is then either no tool's doing or a write already
        recorded by ``write_ended``. A write that never ends is waited for a bounded time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PENDING_WAIT_SECONDS
        while True:
            while any(p in self._pending for p in paths) and loop.time() < deadline:
                self._writes_ended.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        await self._writes_ended.wait()
            probed: dict[str, tuple[str | None, bool, bool]] = await loop.run_in_executor(self.executor, _probe, paths)
            if loop.time() >= deadline or not any(p in self._pending for p in paths):
                return probed

    # -- changes ------------------------------------------------------------------------------------
    async def _handle(self, workspace_id: str, raw: Iterable[tuple[Change, str]]) -> None:
        base = self.workspace_roots.get(workspace_id)
        if base is None:
            return
        base_real = self._real_roots.get(workspace_id) or str(base)
        by_path: dict[str, set[Change]] = {}
        for change, path in raw:
            if os.path.basename(path).startswith(TMP_PREFIX):
                continue
            by_path.setdefault(path, set()).add(change)
        if not by_path:
            return
        probed = await self._probe_settled(list(by_path))
        changes: list[dict[str, Any]] = []
        for path, kinds in sorted(by_path.items()):
            sha, exists, is_dir = probed[path]
            if is_dir:
                continue  # directories: their files are reported
            known = path in self._last_sha
            previous = self._last_sha.get(path, "<unknown>")
            if exists and sha is not None and previous == sha:
                continue  # already reported this content
            if not exists and known and previous is None:
                continue  # already reported deleted
            self._last_sha[path] = sha if exists else None
            if exists and self._facade_match(path, sha) is not None:
                continue  # the echo of a facade write: the facade reported it on its run
            if not exists:
                kind = "deleted"
            elif Change.added in kinds and not known:
                kind = "added"
            else:
                kind = "modified"
            rel = path[len(base_real) :].lstrip(os.sep).replace(os.sep, "/") if _inside(path, base_real) else path
            changes.append({"_abs": path, "path": rel, "change": kind, "cause": "external"})
        if not changes:
            return
        self.batches += 1
        await self._publish(workspace_id, changes)

    async def _publish_topic(self, workspace_id: str, public: list[dict[str, Any]]) -> None:
        topic = topic_for(workspace_id)
        if self.journal.is_open(topic):
            await self.journal.append(
                topic, "files.changed", {"workspaceId": workspace_id, "changes": public}, "watcher"
            )

    async def _publish(self, workspace_id: str, changes: list[dict[str, Any]]) -> None:
        await self._publish_topic(workspace_id, [{k: v for k, v in c.items() if k != "_abs"} for c in changes])
        for run in self._active_runs(workspace_id):
            roots = self._run_roots(run)
            mine = [
                {k: v for k, v in c.items() if k != "_abs"}
                for c in changes
                if any(_inside(c["_abs"], r) for r in roots)
            ]
            if mine and self.journal.is_open(run.host_run_id) and not self.journal.has_terminal(run.host_run_id):
                with contextlib.suppress(KeyError):
                    await self.journal.append(
                        run.host_run_id, "files.changed", {"workspaceId": workspace_id, "changes": mine}, "watcher"
                    )


def _outermost(paths: Iterable[str]) -> list[str]:
    """Drop directories inside others (one recursive watch covers them)."""
    out: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_inside(path, kept) for kept in out):
            out.append(path)
    return out
