"""``GET /v1/workspaces/{workspaceId}/events``: the workspace's `files.changed` stream (SSE).

Same framing as a run stream (``id: <seq>``, ``event: files.changed``, ``data: <event JSON>``,
heartbeat comments), resumable with ``Last-Event-ID`` or ``?afterSeq=``. The headers and a first
comment go out as soon as the stream opens. The stream has no terminal event: it stays open until
the client leaves or the gateway stops (then the client resumes with ``Last-Event-ID``).
Workspaces are the configured ``[workspaces] roots``; an unknown id, or another actor's workspace
(``[workspaces] owners``), is a 404.
"""

from __future__ import annotations

import re

from aiohttp import web

from agent_gateway.auth import ACTOR_ID, Auth
from agent_gateway.errors import ApiError
from agent_gateway.models import parse_cursor
from agent_gateway.sse import Streams, stream_run
from agent_gateway.watcher import Watcher, topic_for
from agent_gateway.workspace_access import WorkspaceAccess, workspace_not_found

CURSOR_TEXT = re.compile(r"[0-9]{0,18}")


def setup(
    app: web.Application, auth: Auth, watcher: Watcher, workspace_access: WorkspaceAccess, streams: Streams
) -> None:
    async def events(request: web.Request) -> web.StreamResponse:
        workspace_id = request.match_info["workspace_id"]
        # Another actor's workspace ([workspaces] owners) answers like one that does not exist.
        if (
            not watcher.knows(workspace_id)
            or not workspace_access.allows(request[ACTOR_ID], workspace_id)
            or not auth.may_use_workspace(request, workspace_id)  # the actor's workspaces claim
        ):
            raise workspace_not_found(workspace_id)
        if auth.authorizing:
            await auth.authorize(request, "workspaces:read", {"type": "workspace", "id": workspace_id})
        header = request.headers.get("Last-Event-ID")
        name, raw = ("Last-Event-ID", header) if header else ("afterSeq", request.query.get("afterSeq"))
        try:
            if raw is not None and not CURSOR_TEXT.fullmatch(raw):  # ASCII digits only, as /openapi.json says
                raise ValueError(f"a cursor is 0 or up to 18 ASCII digits, got {raw[:40]!r}")
            after = parse_cursor(raw)
        except ValueError as exc:
            raise ApiError(400, "invalid_cursor", f"{name}: {exc}") from exc
        return await stream_run(
            request,
            topic=topic_for(workspace_id),
            after_seq=after,
            is_finished=lambda: False,
            **streams.options(),
        )

    app.router.add_get("/v1/workspaces/{workspace_id}/events", events)
