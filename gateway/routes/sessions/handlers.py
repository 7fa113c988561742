"""The /v1/sessions handlers (:class:`SessionRoutes`) and their input and cursor helpers."""

from __future__ import annotations

import base64
import binascii
import html
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent_gateway.agent_sessions import NotDeclared, declares_delete, delete_agent_session
from agent_gateway.auth import ACTOR_ID
from agent_gateway.declare import parse_model
from agent_gateway.errors import ApiError
from agent_gateway.models import ACTIVE_STATUSES, Run, dumps
from agent_gateway.routes.sessions.declared import BULK_DELETE, EXPORT, LIST, PATCH, SessionPath
from agent_gateway.routes.sessions.export import to_markdown
from agent_gateway.routes.sessions.indexer import SessionIndexer, SessionsDeps
from agent_gateway.transcript import project_transcript, run_transcript

# Runs a session detail / export reads (oldest first).
MAX_RUNS = 500


def _session_id(request: web.Request) -> str:
    """The path's sessionId (``400 invalid_session_id`` if no storage can hold it)."""
    return parse_model(SessionPath, dict(request.match_info), "the path").sessionId


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
        actor_id = request[ACTOR_ID]
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
        asked = LIST.parse_query(request)
        limit, query, agent_id, status, cursor = asked.limit, asked.q, asked.agentId, asked.status, asked.cursor
        statuses = sorted(ACTIVE_STATUSES) if status == "active" else ([status] if status else None)
        if self.deps.auth.authorizing:  # the list as a whole: the caller's own sessions
            await self.deps.auth.authorize(
                request, "sessions:read", {"type": "session", "id": None, "agentId": agent_id}
            )
        await self.indexer.settle()
        actor_id = request[ACTOR_ID]
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
        fmt = EXPORT.parse_query(request).format
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
        body = await PATCH.read_body(request)
        title, pinned = body.title, body.pinned
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
        session_ids = list(dict.fromkeys((await BULK_DELETE.read_body(request)).sessionIds))
        await self.indexer.settle()
        actor_id = request[ACTOR_ID]
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
