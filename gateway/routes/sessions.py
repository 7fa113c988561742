"""/v1/sessions: list, search, read back, export, rename/pin and delete sessions (docs/sessions.md).

A session is a gateway ``sessionId`` within an actor (as runs define it). Everything here is
actor-scoped: another actor's session is a 404. The index is kept by :class:`SessionIndexer`, a
run listener: every status change updates the session's row, and a run's end stores its digest
(from the ``transcript`` projection) for counts and full-text search.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import html
import json
import logging
import re
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from agent_gateway.agent_sessions import NotDeclared, declares_delete, delete_agent_session
from agent_gateway.auth import Auth
from agent_gateway.errors import ApiError, read_json
from agent_gateway.journal import Journal
from agent_gateway.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Run, dumps, events_of_frames
from agent_gateway.runs import MAX_ID_LENGTH, VISIBLE, RunManager
from agent_gateway.storage import Storage
from agent_gateway.transcript import project_transcript, run_transcript

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_QUERY = 500
MAX_BULK = 100
# Runs a session detail / export reads (oldest first).
MAX_RUNS = 500
STATUS_FILTERS = frozenset({"active", *ACTIVE_STATUSES, *TERMINAL_STATUSES})
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


# The query parameters of `GET /v1/sessions` (its OpenAPI declaration lists the same).
LIST_QUERY = frozenset({"q", "agentId", "status", "limit", "cursor"})


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


# -- input ------------------------------------------------------------------------------------------


def _session_id(request: web.Request) -> str:
    return check_session_id(request.match_info["session_id"])


def check_session_id(value: Any, name: str = "session id", code: str = "invalid_session_id") -> str:
    """The rule runs use for their ids (``VISIBLE``: at least one visible character), plus what
    no storage backend can hold (NUL, a lone surrogate)."""
    if not isinstance(value, str) or not VISIBLE.search(value):
        raise ApiError(400, code, f"a {name} must be a string with a visible character")
    if len(value) > MAX_ID_LENGTH:
        raise ApiError(400, code, f"a {name} must be at most {MAX_ID_LENGTH} characters")
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ApiError(400, code, f"a {name} must not contain NUL or a lone surrogate")
    return value


# What encode_cursor writes: unpadded URL-safe base64.
CURSOR_PATTERN = "^[A-Za-z0-9_-]{0,1000}$"  # empty: the first page
CURSOR_SHAPE = re.compile(CURSOR_PATTERN)


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_limit", "limit must be an integer") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise ApiError(400, "invalid_limit", f"limit must be 1..{MAX_LIMIT}")
    return limit


def encode_cursor(value: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str, search: bool) -> Any:
    """A page cursor: ["k", pinned, updatedAt, sessionId] for a list, ["s", offset] for a search."""
    try:
        value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise _unknown_cursor() from exc
    if search:
        if isinstance(value, list) and len(value) == 2 and value[0] == "s" and type(value[1]) is int:
            if 0 <= value[1] <= 100_000:
                return value[1]
    elif (
        isinstance(value, list)
        and len(value) == 4
        and value[0] == "k"
        and value[1] in (0, 1)
        and type(value[2]) is int
        and isinstance(value[3], str)
    ):
        return (value[1], value[2], value[3])
    raise _unknown_cursor()


def _unknown_cursor() -> ApiError:
    # Well-formed (the documented pattern; anything else is a 400) but not a page this API
    # handed out, or one of another query: there is no such page.
    return ApiError(404, "cursor_not_found", "cursor: not a cursor this API returned (or from another query)")


def highlight(snippet: Any) -> str:
    """A storage snippet as HTML: every piece of text escaped (nothing stripped), the hits in
    <mark>, the only markup. The storage gives ``(text, hit)`` pieces, so no stored character
    can become a highlight; a plain string (a storage predating pieces) is text, no hit."""
    if isinstance(snippet, str):
        snippet = [(snippet, False)]
    parts = []
    for text, hit in snippet or ():
        escaped = html.escape(str(text), quote=True)
        parts.append(f"<mark>{escaped}</mark>" if hit else escaped)
    return "".join(parts)


# -- the routes ---------------------------------------------------------------------------------------


class SessionRoutes:
    def __init__(self, deps: SessionsDeps, indexer: SessionIndexer) -> None:
        self.deps = deps
        self.indexer = indexer

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.indexer._db(fn, *args, **kwargs)

    async def _summary(self, actor_id: str, row: dict[str, Any]) -> dict[str, Any]:
        active = await self.deps.runs.active_run(actor_id, row["session_id"])
        runtime = self.deps.runtimes.get(row["agent_id"])
        return {
            "sessionId": row["session_id"],
            "workspaceId": row["workspace_id"],
            "agentId": row["agent_id"],
            "agentName": getattr(runtime, "display_name", None),
            "profile": row["profile"],
            "model": row["model"],
            "title": row["title"],
            "titleCustom": bool(row["title_custom"]),
            "pinned": bool(row["pinned"]),
            "runCount": row["run_count"],
            "messageCount": row["message_count"],
            "toolCount": row["tool_count"],
            "sessionMode": row["last_mode"],
            "lastStatus": row["last_status"],
            "lastRunId": row["last_run_id"],
            "activeRun": active.to_receipt() if active is not None and not active.is_terminal else None,
            "createdAt": row["created_at"],
            "updatedAt": row["updated_at"],
        }

    async def _row(self, request: web.Request, action: str = "sessions:read") -> tuple[str, str, dict[str, Any]]:
        session_id = _session_id(request)
        await self.indexer.settle()
        actor_id = request["actor"]
        row = await self._db(self.deps.storage.get_session_index, actor_id, session_id)
        if row is None:
            raise ApiError(404, "session_not_found", "no such session")
        if self.deps.auth.authorizing:
            resource = {
                "type": "session",
                "id": session_id,
                "agentId": row["agent_id"],
                "workspaceId": row["workspace_id"],
            }
            await self.deps.auth.authorize(request, action, resource)
        return actor_id, session_id, row

    async def list(self, request: web.Request) -> web.Response:
        unknown = set(request.query) - LIST_QUERY
        if unknown:  # as a body's unknown fields: a misspelt filter must not silently list everything
            raise ApiError(400, "invalid_request", f"unknown query parameter(s): {', '.join(sorted(unknown))[:200]}")
        limit = _limit(request)
        query = request.query.get("q", "").strip()
        if len(query) > MAX_QUERY or "\x00" in query:
            raise ApiError(400, "invalid_query", f"q must be at most {MAX_QUERY} characters, without NUL")
        agent_id = request.query.get("agentId") or None  # a filter: any id, "" for none
        if agent_id is not None and (len(agent_id) > MAX_ID_LENGTH or "\x00" in agent_id):
            raise ApiError(400, "invalid_agent_id", f"agentId must be at most {MAX_ID_LENGTH} characters, without NUL")
        status = request.query.get("status") or None
        if status is not None and status not in STATUS_FILTERS:
            raise ApiError(400, "invalid_status", "unknown status filter", known=sorted(STATUS_FILTERS))
        statuses = sorted(ACTIVE_STATUSES) if status == "active" else ([status] if status else None)
        cursor = request.query.get("cursor") or None
        if cursor is not None and not CURSOR_SHAPE.fullmatch(cursor):
            raise ApiError(400, "invalid_cursor", "cursor: not a cursor this API returned")
        if self.deps.auth.authorizing:  # the list as a whole: the caller's own sessions
            await self.deps.auth.authorize(
                request, "sessions:read", {"type": "session", "id": None, "agentId": agent_id}
            )
        await self.indexer.settle()
        actor_id = request["actor"]
        storage = self.deps.storage
        next_cursor: str | None = None
        if query:
            offset = decode_cursor(cursor, search=True) if cursor else 0
            rows = await self._db(
                storage.search_session_index,
                actor_id,
                query,
                agent_id=agent_id,
                statuses=statuses,
                limit=limit + 1,
                offset=offset,
            )
            if len(rows) > limit:
                rows, next_cursor = rows[:limit], encode_cursor(["s", offset + limit])
        else:
            after = decode_cursor(cursor, search=False) if cursor else None
            rows = await self._db(
                storage.list_session_index, actor_id, agent_id=agent_id, statuses=statuses, limit=limit + 1, after=after
            )
            if len(rows) > limit:
                rows = rows[:limit]
                last = rows[-1]
                next_cursor = encode_cursor(["k", last["pinned"], last["updated_at"], last["session_id"]])
        sessions = []
        for row in rows:
            item = await self._summary(actor_id, row)
            if query:
                item["snippet"] = highlight(row.get("snippet"))
                item["score"] = row.get("score")
            sessions.append(item)
        return web.json_response({"schema": "gateway.sessions.v1", "sessions": sessions, "nextCursor": next_cursor})

    async def _detail(self, actor_id: str, session_id: str, row: dict[str, Any], events: bool) -> dict[str, Any]:
        storage = self.deps.storage
        runs: list[Run] = await self._db(storage.list_runs, actor_id=actor_id, session_id=session_id, limit=MAX_RUNS)
        items = []
        for run in runs:
            live = await self.deps.runs.get(run.host_run_id, actor_id) or run  # the live status of an active run
            journal = await self._db(storage.read_events, run.host_run_id)
            transcript = project_transcript(journal, run_transcript(live))
            item: dict[str, Any] = {"receipt": live.to_receipt(), "transcript": transcript}
            if events:
                item["events"] = [e.to_wire() for e in journal]
            items.append(item)
        record = await self._db(storage.get_session, actor_id, session_id) or {}
        summary = await self._summary(actor_id, row)
        return {
            "schema": "gateway.session.v1",
            "session": summary,
            "binding": self._binding(row, record, items),
            "runs": items,
        }

    def _binding(self, row: dict[str, Any], record: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
        runtimes = record.get("runtimes") if isinstance(record.get("runtimes"), dict) else {}
        state = runtimes.get(row["agent_id"]) if isinstance(runtimes.get(row["agent_id"]), dict) else {}
        history = [
            {
                "hostRunId": item["receipt"]["hostRunId"],
                "agentId": item["receipt"]["agentId"],
                "sessionMode": entry["mode"],
                "agentSessionId": entry["agentSessionId"],
                "createdAt": item["receipt"]["createdAt"],
            }
            for item in runs
            for entry in item["transcript"]["modeHistory"]
        ]
        agent_session_id = state.get("agentSessionId") or next(
            (h["agentSessionId"] for h in reversed(history) if h["agentSessionId"]), None
        )
        return {
            "agentId": row["agent_id"],
            "agentSessionId": agent_session_id,
            "sessionMode": row["last_mode"],
            "modeHistory": history,
            "agentSessionDelete": self._can_delete_agent_session(row["agent_id"]),
        }

    def _can_delete_agent_session(self, agent_id: str) -> bool | None:
        runtime = self.deps.runtimes.get(agent_id)
        return declares_delete(runtime) if runtime is not None else False

    async def get(self, request: web.Request) -> web.Response:
        actor_id, session_id, row = await self._row(request)
        return web.Response(
            body=dumps(await self._detail(actor_id, session_id, row, events=False)), content_type="application/json"
        )

    async def export(self, request: web.Request) -> web.Response:
        fmt = request.query.get("format", "json")
        if fmt not in ("json", "markdown"):
            raise ApiError(400, "invalid_format", "format must be json or markdown")
        actor_id, session_id, row = await self._row(request)
        detail = await self._detail(actor_id, session_id, row, events=fmt == "json")
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in session_id)[:80] or "session"
        if fmt == "json":
            detail["schema"] = "gateway.session_export.v1"
            response = web.Response(body=dumps(detail), content_type="application/json")
            response.headers["Content-Disposition"] = f'attachment; filename="{name}.json"'
            return response
        response = web.Response(text=to_markdown(detail), content_type="text/markdown")
        response.headers["Content-Disposition"] = f'attachment; filename="{name}.md"'
        return response

    async def patch(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not body:
            raise ApiError(400, "invalid_request", 'send {"title": "...", "pinned": true|false}')
        unknown = set(body) - {"title", "pinned"}
        if unknown:
            raise ApiError(400, "invalid_request", f"unknown field(s): {', '.join(sorted(unknown))}")
        title, pinned = body.get("title"), body.get("pinned")
        if title is not None and (not isinstance(title, str) or len(title) > 200):
            raise ApiError(400, "invalid_request", 'title must be a string of at most 200 characters ("": default)')
        if pinned is not None and not isinstance(pinned, bool):
            raise ApiError(400, "invalid_request", "pinned must be true or false")
        actor_id, session_id, _row = await self._row(request, "sessions:write")
        await self._db(self.deps.storage.update_session_index, actor_id, session_id, title=title, pinned=pinned)
        row = await self._db(self.deps.storage.get_session_index, actor_id, session_id)
        return web.json_response(
            {"schema": "gateway.session_summary.v1", "session": await self._summary(actor_id, row)}
        )

    async def _refuse_active(self, actor_id: str, session_id: str) -> None:
        """409 if the session has an active run; inside `runs.hold_sessions`, so none starts after."""
        active = await self.deps.runs.session_busy(actor_id, session_id)
        if active is None:
            stored = await self._db(
                self.deps.storage.list_runs, actor_id=actor_id, session_id=session_id, statuses=sorted(ACTIVE_STATUSES)
            )
            active = stored[0] if stored else None
        if active is not None:
            raise ApiError(
                409, "session_active", "the session has an active run; cancel it first", hostRunId=active.host_run_id
            )

    async def _delete(self, actor_id: str, session_id: str) -> bool:
        # Between two group commits and the indexer's writes (the journal's storage lock): an
        # index write of one of its runs that comes later finds the run gone and writes nothing.
        return bool(await self.deps.journal.write(self.deps.storage.delete_session_history, actor_id, session_id))

    async def delete(self, request: web.Request) -> web.Response:
        actor_id, session_id, _row = await self._row(request, "sessions:delete")
        async with self.deps.runs.hold_sessions(actor_id, [session_id]):
            await self._refuse_active(actor_id, session_id)
            await self._delete(actor_id, session_id)
        return web.json_response({"schema": "gateway.sessions_deleted.v1", "deleted": [session_id], "notFound": []})

    async def bulk_delete(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        ids = body.get("sessionIds") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or len(ids) > MAX_BULK or set(body) != {"sessionIds"}:
            raise ApiError(400, "invalid_request", f'send {{"sessionIds": [...]}} with 1..{MAX_BULK} ids')
        session_ids = list(dict.fromkeys(check_session_id(value) for value in ids))
        await self.indexer.settle()
        actor_id = request["actor"]
        if self.deps.auth.authorizing:  # all or nothing: refuse before deleting any
            for session_id in session_ids:
                await self.deps.auth.authorize(request, "sessions:delete", {"type": "session", "id": session_id})
        deleted, missing = [], []
        async with self.deps.runs.hold_sessions(actor_id, session_ids):
            for session_id in session_ids:  # all or nothing: refuse before deleting any
                await self._refuse_active(actor_id, session_id)
            for session_id in session_ids:
                (deleted if await self._delete(actor_id, session_id) else missing).append(session_id)
        return web.json_response({"schema": "gateway.sessions_deleted.v1", "deleted": deleted, "notFound": missing})

    async def delete_agent_session(self, request: web.Request) -> web.Response:
        actor_id, session_id, row = await self._row(request, "sessions:delete")
        agent_id = row["agent_id"]
        runtime = self.deps.runtimes.get(agent_id)
        if runtime is None or self._can_delete_agent_session(agent_id) is False:
            raise _not_offered(agent_id)
        async with self.deps.runs.hold_sessions(actor_id, [session_id]):  # no run starts meanwhile
            return await self._delete_agent_session(actor_id, session_id, agent_id, runtime)

    async def _delete_agent_session(self, actor_id: str, session_id: str, agent_id: str, runtime: Any) -> web.Response:
        await self._refuse_active(actor_id, session_id)
        storage = self.deps.storage
        record = await self._db(storage.get_session, actor_id, session_id) or {}
        runtimes = record.get("runtimes") if isinstance(record.get("runtimes"), dict) else {}
        state = runtimes.get(agent_id) if isinstance(runtimes.get(agent_id), dict) else {}
        agent_session_id = state.get("agentSessionId")
        if not isinstance(agent_session_id, str) or not agent_session_id:
            raise ApiError(404, "agent_session_not_found", "the gateway holds no agent session id for this session")
        try:
            await delete_agent_session(runtime, agent_session_id, dict(state))
        except NotDeclared:
            raise _not_offered(agent_id) from None
        except Exception as exc:
            raise ApiError(
                502, "agent_error", f"{agent_id} could not delete its session: {type(exc).__name__}: {exc}"
            ) from exc
        # The binding is gone: the next run of this session starts a new agent session.
        runtimes.pop(agent_id, None)
        await self._db(storage.put_session, actor_id, session_id, record)
        return web.json_response(
            {"schema": "gateway.agent_session_deleted.v1", "agentId": agent_id, "agentSessionId": agent_session_id}
        )


def _not_offered(agent_id: str) -> ApiError:
    return ApiError(
        409, "not_supported", f"agent {agent_id!r} does not offer deleting its own sessions", agentId=agent_id
    )


# Characters inline Markdown reads as emphasis, code, links, headings, tables or strikethrough.
_MD_PUNCTUATION = frozenset("\\`*_[]#|~!")
_BACKTICKS = re.compile(r"`+")


def md_text(value: Any) -> str:
    """Text as inline Markdown that reads as written: one line, HTML escaped (a ``<b>`` shows as
    ``<b>``), Markdown punctuation backslash-escaped."""
    out = []
    for char in " ".join(str(value).split()):
        if char in "<>&":
            out.append(html.escape(char))
        elif char in _MD_PUNCTUATION:
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def md_code(value: Any) -> str:
    """A code span holding ``value`` verbatim (on one line): its backtick run is longer than any
    inside, padded when the text starts or ends with a backtick or a space."""
    text = " ".join(str(value).splitlines())
    if not text:
        return "` `"
    ticks = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " ") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def md_fenced(body: str) -> list[str]:
    """A message body as a fenced block, so nothing in it (a ``# Heading``, HTML, a fence of its
    own) escapes its message: the fence is longer than any backtick run in the body, and what a
    fence holds is shown as written (HTML in it is text, never markup)."""
    ticks = "`" * max(3, max((len(m) for m in _BACKTICKS.findall(body)), default=0) + 1)
    return [f"{ticks}text", body, ticks]


def to_markdown(detail: dict[str, Any]) -> str:
    """A session export as Markdown: each run's question, answer, folded thoughts, tools,
    citations and changed files. Bodies are fenced and everything else escaped, so the export's
    structure is the gateway's alone whatever the user or the agent wrote."""
    session = detail["session"]
    binding = detail["binding"]
    lines = [
        f"# {md_text(session['title'] or session['sessionId'])}",
        "",
        f"- Session: {md_code(session['sessionId'])}",
        f"- Agent: {md_code(session['agentId'])}"
        + (f" (agent session {md_code(binding['agentSessionId'])})" if binding["agentSessionId"] else ""),
        f"- Runs: {session['runCount']}",
        "",
    ]
    for number, item in enumerate(detail["runs"], 1):
        receipt, transcript = item["receipt"], item["transcript"]
        mode = f", {md_text(transcript['sessionMode'])}" if transcript["sessionMode"] else ""
        lines += [f"## Run {number} — {md_text(receipt['status'])}{mode}", "", md_code(receipt["hostRunId"]), ""]
        if transcript["question"]:
            lines += ["**User**", "", *md_fenced(transcript["question"]), ""]
        if transcript["thoughts"]["text"]:
            thoughts = md_fenced(transcript["thoughts"]["text"])
            lines += ["<details><summary>Thoughts</summary>", "", *thoughts, "", "</details>", ""]
        for card in transcript["tools"]:
            name = card.get("title") or card.get("tool") or card.get("kind") or "tool"
            receipt_id = f" (receipt {md_code(card['receiptId'])})" if card.get("receiptId") else ""
            lines.append(
                f"- Tool {md_code(card['toolCallId'])}: {md_text(name)} — {md_text(card.get('status'))}{receipt_id}"
            )
        for permission in transcript["permissions"]:
            outcome = permission.get("outcome") or permission.get("status")
            option = f" {md_text(permission['optionId'])}" if permission.get("optionId") else ""
            lines.append(
                f"- Permission {md_code(permission.get('requestId'))}: {md_text(permission.get('title') or '')} — "
                f"{md_text(outcome)}{option}"
            )
        if transcript["tools"] or transcript["permissions"]:
            lines.append("")
        if transcript["answer"]["text"]:
            lines += ["**Assistant**", "", *md_fenced(transcript["answer"]["text"]), ""]
        if transcript["citations"]:
            lines += ["Sources:", ""]
            lines += [f"- {_citation(c)}" for c in transcript["citations"]]
            lines.append("")
        if transcript["files"]:
            lines += ["Files changed:", ""] + [f"- {md_code(f['path'])}" for f in transcript["files"]] + [""]
        if transcript["terminal"] and transcript["terminal"].get("reason") and receipt["status"] != "completed":
            lines += [f"_{md_text(transcript['terminal']['reason'])}_", ""]
    return "\n".join(lines)


def _citation(citation: dict[str, Any]) -> str:
    """A citation's own Markdown (a link, as the tool wrote it) on one line with HTML escaped;
    a bare URL as code."""
    markdown = citation.get("markdown")
    if isinstance(markdown, str) and markdown.strip():
        return html.escape(" ".join(markdown.split()), quote=False)
    return md_code(citation.get("url") or "")


def setup(app: web.Application, deps: SessionsDeps) -> None:
    indexer = SessionIndexer(deps)
    deps.runs.listeners.append(indexer.on_run)
    app.on_cleanup.append(indexer.stop)
    routes = SessionRoutes(deps, indexer)
    app.router.add_get("/v1/sessions", routes.list)
    app.router.add_post("/v1/sessions:delete", routes.bulk_delete)
    app.router.add_get("/v1/sessions/{session_id}", routes.get)
    app.router.add_patch("/v1/sessions/{session_id}", routes.patch)
    app.router.add_delete("/v1/sessions/{session_id}", routes.delete)
    app.router.add_get("/v1/sessions/{session_id}/export", routes.export)
    app.router.add_delete("/v1/sessions/{session_id}/agent-session", routes.delete_agent_session)


# -- OpenAPI: this module's path items, merged into /openapi.json by routes/system.py -----------------
# (Kept here, self-contained, so gateway/openapi.json can change independently.)

# The error responses gateway/openapi.json defines, by status.
_ERROR_RESPONSES = {
    "400": "BadRequest",
    "401": "Unauthorized",
    "403": "Forbidden",
    "404": "NotFound",
    "409": "Conflict",
    "413": "PayloadTooLarge",
    "415": "UnsupportedMediaType",
    "503": "ServiceUnavailable",
}
_BAD_GATEWAY = {
    "description": "the agent could not delete its session",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _err(status: str) -> dict[str, Any]:
    if status == "502":
        return _BAD_GATEWAY
    return {"$ref": f"#/components/responses/{_ERROR_RESPONSES[status]}"}


_ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": VISIBLE.pattern}
_SESSION_ID = {"name": "sessionId", "in": "path", "required": True, "schema": _ID_SCHEMA}
# What every sessions route can answer besides its own statuses.
_ERRORS = {status: _err(status) for status in ("400", "401", "403", "404", "503")}
# ... and a route that reads a JSON body.
_BODY_ERRORS = {status: _err(status) for status in ("413", "415")}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


OPENAPI_SCHEMAS: dict[str, Any] = {
    "SessionSummary": {
        "type": "object",
        "properties": {
            "sessionId": {"type": "string"},
            "workspaceId": {"type": "string"},
            "agentId": {"type": "string"},
            "agentName": {"type": ["string", "null"]},
            "profile": {"type": ["string", "null"]},
            "model": {"type": ["string", "null"]},
            "title": {"type": "string"},
            "titleCustom": {"type": "boolean"},
            "pinned": {"type": "boolean"},
            "runCount": {"type": "integer"},
            "messageCount": {"type": "integer"},
            "toolCount": {"type": "integer"},
            "sessionMode": {"type": ["string", "null"]},
            "lastStatus": {"type": ["string", "null"]},
            "lastRunId": {"type": ["string", "null"]},
            "activeRun": {"oneOf": [{"$ref": "#/components/schemas/Run"}, {"type": "null"}]},
            "createdAt": {"type": "integer"},
            "updatedAt": {"type": "integer"},
            "snippet": {"type": "string", "description": "search only: HTML-escaped text, hits in <mark>"},
            "score": {"type": "number", "description": "search only: the engine's rank"},
        },
    },
    "Transcript": {
        "type": "object",
        "description": "gateway.transcript.v1: one run's response projection (docs/sessions.md)",
        "properties": {
            "schema": {"const": "gateway.transcript.v1"},
            "hostRunId": {"type": ["string", "null"]},
            "question": {"type": ["string", "null"]},
            "status": {"type": "string"},
            "answer": {"type": "object"},
            "thoughts": {"type": "object"},
            "tools": {"type": "array", "items": {"type": "object"}},
            "plan": {"type": ["object", "null"]},
            "permissions": {"type": "array", "items": {"type": "object"}},
            "citations": {"type": "array", "items": {"type": "object"}},
            "files": {"type": "array", "items": {"type": "object"}},
            "sessionMode": {"type": ["string", "null"]},
            "modeHistory": {"type": "array", "items": {"type": "object"}},
        },
    },
    "SessionDetail": {
        "type": "object",
        "properties": {
            "schema": {"type": "string"},
            "session": {"$ref": "#/components/schemas/SessionSummary"},
            "binding": {"type": "object"},
            "runs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "receipt": {"$ref": "#/components/schemas/Run"},
                        "transcript": {"$ref": "#/components/schemas/Transcript"},
                        "events": {"type": "array", "items": {"type": "object"}},
                    },
                },
            },
        },
    },
    "SessionsDeleted": {
        "type": "object",
        "properties": {
            "schema": {"const": "gateway.sessions_deleted.v1"},
            "deleted": {"type": "array", "items": {"type": "string"}},
            "notFound": {"type": "array", "items": {"type": "string"}},
        },
    },
}

OPENAPI_PATHS: dict[str, Any] = {
    "/v1/sessions": {
        "get": {
            "summary": "The caller's sessions: pinned first, then most recently updated; with q, a ranked search",
            "parameters": [
                {"name": "q", "in": "query", "schema": {"type": "string", "maxLength": MAX_QUERY}},
                {"name": "agentId", "in": "query", "schema": {"type": "string", "maxLength": 200}},
                {"name": "status", "in": "query", "schema": {"type": "string", "enum": sorted(STATUS_FILTERS)}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
                {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": CURSOR_PATTERN}},
            ],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "schema": {"const": "gateway.sessions.v1"},
                            "sessions": {"type": "array", "items": {"$ref": "#/components/schemas/SessionSummary"}},
                            "nextCursor": {"type": ["string", "null"]},
                        },
                    },
                    "A page of sessions",
                ),
                **_ERRORS,
            },
        }
    },
    "/v1/sessions:delete": {
        "post": {
            "summary": "Delete the gateway's history of several sessions (all refused if one has an active run)",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["sessionIds"],
                            "additionalProperties": False,
                            "properties": {
                                "sessionIds": {
                                    "type": "array",
                                    "minItems": 1,
                                    "maxItems": MAX_BULK,
                                    "items": _ID_SCHEMA,
                                }
                            },
                        }
                    }
                },
            },
            "responses": {
                "200": _json({"$ref": "#/components/schemas/SessionsDeleted"}, "What was deleted"),
                **_ERRORS,
                **_BODY_ERRORS,
                "409": _err("409"),
            },
        }
    },
    "/v1/sessions/{sessionId}": {
        "parameters": [_SESSION_ID],
        "get": {
            "summary": "A session: its runs' transcripts in order and the runtime binding",
            "responses": {"200": _json({"$ref": "#/components/schemas/SessionDetail"}, "The session"), **_ERRORS},
        },
        "patch": {
            "summary": "Rename (title; empty: the default) and/or pin a session",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "additionalProperties": False,
                            "minProperties": 1,
                            "properties": {
                                "title": {"type": "string", "maxLength": 200},
                                "pinned": {"type": "boolean"},
                            },
                        }
                    }
                },
            },
            "responses": {"200": _json({"type": "object"}, "The updated summary"), **_ERRORS, **_BODY_ERRORS},
        },
        "delete": {
            "summary": "Delete the gateway's history of a session (never the agent's own store)",
            "responses": {
                "200": _json({"$ref": "#/components/schemas/SessionsDeleted"}, "Deleted"),
                **_ERRORS,
                "409": _err("409"),
            },
        },
    },
    "/v1/sessions/{sessionId}/export": {
        "parameters": [_SESSION_ID],
        "get": {
            "summary": "Export a session: runs, transcripts, events and binding (json) or a readable document",
            "parameters": [
                {"name": "format", "in": "query", "schema": {"type": "string", "enum": ["json", "markdown"]}}
            ],
            "responses": {
                "200": {
                    "description": "The export",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/SessionDetail"}},
                        "text/markdown": {"schema": {"type": "string"}},
                    },
                },
                **_ERRORS,
            },
        },
    },
    "/v1/sessions/{sessionId}/agent-session": {
        "parameters": [_SESSION_ID],
        "delete": {
            "summary": "Ask the agent to delete its own session (only when the runtime declares it can)",
            "responses": {
                "200": _json({"type": "object"}, "Deleted by the agent"),
                **_ERRORS,
                "409": _err("409"),
                "502": _err("502"),
            },
        },
    },
}
