"""``GET /v1/workspaces/{workspaceId}/events``: the workspace's `files.changed` stream (SSE).

Same framing as a run stream (``id: <seq>``, ``event: files.changed``, ``data: <event JSON>``,
heartbeat comments), resumable with ``Last-Event-ID`` or ``?afterSeq=``. The headers and a first
comment go out as soon as the stream opens. The stream has no terminal event: it stays open until
the client leaves or the gateway stops (then the client resumes with ``Last-Event-ID``).
Workspaces are the configured ``[workspaces] roots``; an unknown id, or another actor's workspace
(``[workspaces] owners``), is a 404.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway.auth import ACTOR_ID, Auth
from agent_gateway.declare import Route, RouteResponse
from agent_gateway.errors import ApiError
from agent_gateway.routes.runs import LAST_EVENT_ID, AfterSeq, cursor_problem
from agent_gateway.sse import Streams, stream_run
from agent_gateway.watcher import Watcher, topic_for
from agent_gateway.workspace_access import WorkspaceAccess, workspace_not_found

REQUEST = ConfigDict(extra="forbid", strict=True, defer_build=True)


class WorkspacePath(BaseModel):
    model_config = REQUEST
    workspaceId: str = Field(min_length=1, description="A configured workspace the actor may use")


class WorkspaceEventsQuery(BaseModel):
    model_config = REQUEST
    afterSeq: AfterSeq = 0


WORKSPACE_EVENTS: Route[Any, WorkspaceEventsQuery, WorkspacePath] = Route(
    "GET",
    "/v1/workspaces/{workspaceId}/events",
    "SSE of files.changed events of a workspace; resumable with Last-Event-ID/afterSeq like run streams; never "
    "ends by itself",
    operation_id="streamWorkspaceEvents",
    params=WorkspacePath,
    query=WorkspaceEventsQuery,
    headers=(LAST_EVENT_ID,),
    responses={
        200: RouteResponse(
            "text/event-stream of files.changed events; `: ping` comments as heartbeat",
            content={"text/event-stream": {"schema": {"$ref": "#/components/schemas/SseEvent"}}},
        )
    },
    errors=(400, 401, 403, 404, 503),
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (WORKSPACE_EVENTS,)


def setup(
    app: web.Application, auth: Auth, watcher: Watcher, workspace_access: WorkspaceAccess, streams: Streams
) -> None:
    async def events(request: web.Request) -> web.StreamResponse:
        workspace_id = WORKSPACE_EVENTS.parse_path(request).workspaceId
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
        after = WORKSPACE_EVENTS.parse_query(request).afterSeq
        if header:  # wins over afterSeq
            after, problem = cursor_problem(header, "Last-Event-ID")
            if problem:
                raise ApiError(400, "invalid_cursor", problem)
        return await stream_run(
            request,
            topic=topic_for(workspace_id),
            after_seq=after,
            is_finished=lambda: False,
            **streams.options(),
        )

    app.router.add_route(WORKSPACE_EVENTS.method, WORKSPACE_EVENTS.path, events)
