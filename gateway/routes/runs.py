"""/v1/runs and /v1/sessions routes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from agent_gateway import api_models
from agent_gateway.auth import ACTOR_ID, Auth, run_resource
from agent_gateway.builtin import ui_projection
from agent_gateway.declare import Route, RouteResponse, component, refuse
from agent_gateway.errors import ApiError, error_response
from agent_gateway.journal import Journal
from agent_gateway.models import Run, dumps, format_cursor, parse_cursor
from agent_gateway.preferences import Preferences
from agent_gateway.runs import AdmissionRefused, RunManager
from agent_gateway.sse import RunEnded, Streams, stream_run
from agent_gateway.webhooks import Webhooks, delivery_view

DEFAULT_PAGE = 500
MAX_PAGE = 5000


# What /openapi.json declares: ASCII digits only, no sign, no spaces (empty means 0).
CURSOR_PATTERN = "^[0-9]{0,18}$"
_CURSOR_TEXT = re.compile(r"[0-9]{0,18}")
_LIMIT_TEXT = re.compile(r"[0-9]{1,9}")


def cursor_problem(value: str | None, name: str) -> tuple[int, str | None]:
    """A cursor's seq, or what is wrong with it (``None`` is 0)."""
    if value is not None and not _CURSOR_TEXT.fullmatch(value):
        return 0, f"{name}: a cursor is 0 or up to 18 ASCII digits, got {value[:40]!r}"
    try:
        return parse_cursor(value), None
    except ValueError as exc:
        return 0, f"{name}: {exc}"


def _cursor(value: str | None, name: str) -> int:
    seq, problem = cursor_problem(value, name)
    if problem:
        raise ApiError(400, "invalid_cursor", problem)
    return seq


def _after_seq(value: Any) -> Any:
    if not isinstance(value, str):
        raise refuse("invalid_cursor", "afterSeq: a cursor is text")
    seq, problem = cursor_problem(value, "afterSeq")
    if problem:
        raise refuse("invalid_cursor", problem)
    return seq


def _page_limit(value: Any) -> Any:
    if not isinstance(value, str) or not _LIMIT_TEXT.fullmatch(value):  # int() would take " 5", "+5" and "5_0"
        raise refuse("invalid_limit", f"limit must be an integer 1..{MAX_PAGE}")
    limit = int(value)
    if not 1 <= limit <= MAX_PAGE:
        raise refuse("invalid_limit", f"limit must be 1..{MAX_PAGE}")
    return limit


# afterSeq: the cursor's text in the document, its seq once parsed.
AfterSeq = Annotated[
    int,
    BeforeValidator(_after_seq),
    WithJsonSchema({"type": "string", "pattern": CURSOR_PATTERN}),
    Field(
        description="Strictly-after cursor: ASCII digits, 0 (or empty) or the 18-digit padded seq of an event.",
        json_schema_extra=api_models.no_default,  # (the parsed default, 0, is no text)
    ),
]
# A projection by name: the served document lists the gateway's (components/schemas/Projection).
ProjectionName = Annotated[str | None, component("Projection")]
REQUEST = ConfigDict(extra="forbid", strict=True, defer_build=True)


class RunPath(BaseModel):
    model_config = REQUEST
    hostRunId: str = Field(min_length=1, description="A run of the calling actor")


class PermissionPath(RunPath):
    requestId: str = Field(min_length=1, description="The requestId of the permission.requested event")


class SessionPath(BaseModel):
    model_config = REQUEST
    sessionId: str = Field(
        min_length=1,
        description="A session of the calling actor (one that holds a `/` cannot be named in a path: 404)",
    )


class EventsQuery(BaseModel):
    model_config = REQUEST
    afterSeq: AfterSeq = 0
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE), BeforeValidator(_page_limit)] = DEFAULT_PAGE
    projection: ProjectionName = None


class StreamQuery(BaseModel):
    model_config = REQUEST
    afterSeq: AfterSeq = 0
    projection: ProjectionName = None


class PermissionAnswer(BaseModel):
    """The answer to a permission request: one of the options it offered."""

    model_config = REQUEST
    optionId: str = Field(min_length=1, description="One of the offered options")

    @model_validator(mode="before")
    @classmethod
    def _one_option(cls, body: Any) -> Any:
        option = body.get("optionId") if isinstance(body, dict) else None
        if not isinstance(option, str) or not option or set(body) != {"optionId"}:
            raise refuse("invalid_request", 'send {"optionId": "<one of the offered options>"}')
        return body


class ActiveRun(BaseModel):
    model_config = ConfigDict(defer_build=True)
    schema_: Literal["gateway.active_run.v1"] = Field(alias="schema")
    sessionId: str
    run: api_models.Run | None


RUN_ID_HEADER = "X-Host-Run-Id"
STREAM_FLAGS = {"1": True, "true": True, "0": False, "false": False, "": False}


class CreateRunQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    stream: Literal["0", "1", "true", "false", ""] | None = None

    @classmethod
    def adjust_openapi_schema(cls, schema: dict[str, Any]) -> None:
        # a query parameter is text or absent, never null
        schema["properties"]["stream"] = {"type": "string", "enum": ["0", "1", "true", "false", ""]}


def _run_links() -> dict[str, Any]:
    """What a client can follow from a run's receipt (the document's links, for stateful tests)."""
    by_run = ("GetRun", "getRun"), ("GetRunEvents", "getRunEvents"), ("StreamRun", "streamRun")
    links = {
        name: {"operationId": op, "parameters": {"hostRunId": "$response.body#/hostRunId"}}
        for name, op in (*by_run, ("CancelRun", "cancelRun"), ("GetRunReceipts", "getRunReceipts"))
    }
    links["GetActiveRun"] = {"operationId": "getActiveRun", "parameters": {"sessionId": "$response.body#/sessionId"}}
    return links


def _run_created(description: str, location: str | None) -> RouteResponse:
    location_header: dict[str, Any] = {"required": True, "schema": {"type": "string"}}
    if location:
        location_header["description"] = location
    return RouteResponse(
        description,
        api_models.Run,
        content={"text/event-stream": {"schema": {"$ref": "#/components/schemas/SseEvent"}}},
        headers={
            "Location": location_header,
            RUN_ID_HEADER: {"required": True, "schema": {"type": "string"}, "description": "The run's hostRunId"},
        },
        links=_run_links(),
    )


CREATE_RUN: Route[api_models.RunRequest, CreateRunQuery] = Route(
    "POST",
    "/v1/runs",
    "Create a run (201), or return the run of a repeated requestId (200); as JSON, or as the run's SSE stream",
    operation_id="createRun",
    description="Create-and-stream: with `Accept: text/event-stream` (and no `application/json` in Accept) or "
    "`?stream=1`, the answer is the run's SSE stream from seq 1 (or after the `Last-Event-ID` header's seq: ASCII "
    "digits, else 400 `invalid_cursor`), exactly as `GET /v1/runs/{hostRunId}/stream` sends it, in the same round "
    "trip: its first event, `run.created`, holds the receipt, and the `X-Host-Run-Id` and `Location` headers name "
    "the run. A repeat with the same requestId streams the same run (200), so a retry after a lost connection "
    "resumes with `Last-Event-ID`. Errors are the usual JSON, before any stream starts. A second run of a session "
    "that still has an active run follows its `multitaskStrategy` (enqueue, reject: 409 `session_busy`, "
    "interrupt, rollback). The actor's preferences fill what the body leaves out (agentId, context.refs, "
    "options.model and options.profile), once the body is valid.",
    body=api_models.RunRequest,
    query=CreateRunQuery,
    query_descriptions={
        "stream": "1 or true: answer with the run's SSE stream (create-and-stream); 0, false or empty: the JSON "
        "receipt. Wins over Accept. No other query parameter is taken (400 `invalid_request`)."
    },
    responses={
        200: _run_created("The requestId was used before with the same body: the first run", None),
        201: _run_created("The run was created (gateway.run.v1)", "/v1/runs/{hostRunId}"),
    },
    errors=(400, 401, 403, 404, 409, 413, 415, 429, 503),
)
RUN_ERRORS = (400, 401, 403, 404, 503)
LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "schema": {"type": "string", "pattern": CURSOR_PATTERN},
    "description": "Resume after this event id (the padded seq); wins over afterSeq.",
}
RECEIPT = "The run receipt (gateway.run.v1)"
GET_RUN: Route[Any, Any, RunPath] = Route(
    "GET",
    "/v1/runs/{hostRunId}",
    "The run receipt",
    operation_id="getRun",
    params=RunPath,
    responses={200: RouteResponse(RECEIPT, api_models.Run)},
    errors=RUN_ERRORS,
)
RUN_EVENTS: Route[Any, EventsQuery, RunPath] = Route(
    "GET",
    "/v1/runs/{hostRunId}/events",
    "A page of journal events strictly after afterSeq",
    operation_id="getRunEvents",
    params=RunPath,
    query=EventsQuery,
    responses={200: RouteResponse("Events (gateway.run_events.v1)", api_models.EventPage)},
    errors=RUN_ERRORS,
)
RUN_WEBHOOK: Route[Any, Any, RunPath] = Route(
    "GET",
    "/v1/runs/{hostRunId}/webhook",
    "The run's webhook delivery",
    operation_id="getRunWebhook",
    params=RunPath,
    responses={
        200: RouteResponse("Its delivery state (webhook null: the run has no webhook)", api_models.WebhookDelivery)
    },
    errors=RUN_ERRORS,
)
STREAM_RUN: Route[Any, StreamQuery, RunPath] = Route(
    "GET",
    "/v1/runs/{hostRunId}/stream",
    "SSE: replay after the cursor, then tail; closes after the terminal event",
    operation_id="streamRun",
    params=RunPath,
    query=StreamQuery,
    headers=(LAST_EVENT_ID,),
    responses={
        200: RouteResponse(
            "text/event-stream: one SSE event per journal event (`id`, `event`, `data`), `: ping` comments as "
            "heartbeat; the stream ends after the terminal event",
            content={"text/event-stream": {"schema": {"$ref": "#/components/schemas/SseEvent"}}},
        )
    },
    errors=RUN_ERRORS,
)
CANCEL_RUN: Route[Any, Any, RunPath] = Route(
    "POST",
    "/v1/runs/{hostRunId}/cancel",
    "Cancel a run: 202 while it stops, 200 if it already ended. No body.",
    operation_id="cancelRun",
    params=RunPath,
    headers=(
        {
            "name": "X-Agent-Gateway-Client",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "With no tokens configured, a body-less state-changing request needs this header (any "
            "value) or `Content-Type: application/json`.",
        },
    ),
    responses={
        200: RouteResponse(RECEIPT, api_models.Run),
        202: RouteResponse("Cancel requested; the run is stopping", api_models.Run),
    },
    errors=RUN_ERRORS,
)
ANSWER_PERMISSION: Route[PermissionAnswer, Any, PermissionPath] = Route(
    "POST",
    "/v1/runs/{hostRunId}/permissions/{requestId}",
    "Answer a permission request the agent raised (a permission.requested event)",
    operation_id="answerPermission",
    params=PermissionPath,
    body=PermissionAnswer,
    responses={200: RouteResponse(RECEIPT, api_models.Run)},
    errors=(400, 401, 403, 404, 409, 413, 415, 503),
)
# Any one path segment: a sessionId may hold braces, which aiohttp's default variable refuses.
ACTIVE_RUN: Route[Any, Any, SessionPath] = Route(
    "GET",
    "/v1/sessions/{sessionId:[^/]+}/active-run",
    "The session's active (never terminal) run, or null",
    operation_id="getActiveRun",
    params=SessionPath,
    responses={200: RouteResponse("Active run", ActiveRun)},
    errors=RUN_ERRORS,
)
# The core's declared routes: /openapi.json takes their operations from here.
DECLARED: tuple[Route[Any, Any, Any], ...] = (
    CREATE_RUN,
    GET_RUN,
    RUN_EVENTS,
    RUN_WEBHOOK,
    STREAM_RUN,
    CANCEL_RUN,
    ANSWER_PERMISSION,
    ACTIVE_RUN,
)


def _wants_stream(request: web.Request) -> bool:
    """Create-and-stream: `?stream=1`, or an Accept header asking for text/event-stream and not
    for JSON (an Accept naming both keeps the JSON receipt)."""
    flag = CREATE_RUN.parse_query(request).stream if request.rel_url.raw_query_string else None
    if flag is not None:
        return STREAM_FLAGS[flag]
    accept = request.headers.get("Accept", "")
    return "text/event-stream" in accept and "application/json" not in accept


def _receipt(run: Run) -> web.Response:
    return web.json_response(run.to_receipt())


@dataclass(frozen=True)
class RunRoutesDeps:
    """What the /v1/runs routes use."""

    auth: Auth
    runs: RunManager
    journal: Journal
    streams: Streams
    preferences: Preferences
    # Projections by name (the register_projections hook); "ui" is the built-in wire form.
    projections: Mapping[str, Any]
    webhooks: Webhooks
    executor: Executor


class RunRoutes:
    def __init__(self, deps: RunRoutesDeps) -> None:
        self.deps = deps

    async def _run(self, request: web.Request, action: str = "runs:read") -> Run:
        run = await self.deps.runs.get(request.match_info["hostRunId"], request[ACTOR_ID])
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        if self.deps.auth.authorizing:
            await self.deps.auth.authorize(request, action, run_resource(run))
        return run

    def _projection(self, name: str | None) -> Any:
        if name is None:
            name = "ui"
        project = self.deps.projections.get(name)
        if project is ui_projection or (name == "ui" and project is None):
            return None  # the fast path: the event's own wire JSON
        if project is None:
            raise ApiError(
                400, "unknown_projection", f"unknown projection {name!r}", known=sorted(["ui", *self.deps.projections])
            )
        return project

    async def create(self, request: web.Request) -> web.StreamResponse:
        stream = _wants_stream(request)
        # Checked before the run exists: a bad cursor must not leave a run behind.
        header = request.headers.get("Last-Event-ID") if stream else None
        after = _cursor(header, "Last-Event-ID") if header else 0
        # The body is validated as sent; the actor's defaults fill what it left out afterwards.
        sent = (await CREATE_RUN.read_body(request)).request()
        body = await self.deps.preferences.apply_run_defaults(request[ACTOR_ID], sent)
        try:
            run, created = await self.deps.runs.create(
                request[ACTOR_ID], body, self.deps.auth.run_create_check(request), request.headers, validated=True
            )
        except AdmissionRefused as refused:  # 429: the limit's JSON error, and when to retry
            response = error_response(refused.status, refused.code, str(refused), **refused.extra)
            response.headers["Retry-After"] = str(refused.retry_after)
            return response
        headers = {"Location": f"/v1/runs/{run.host_run_id}", RUN_ID_HEADER: run.host_run_id}
        if stream:  # create-and-stream: the new run's events from seq 1, in the same round trip
            return await self._stream(request, run, after, None, status=201 if created else 200, headers=headers)
        response = _receipt(run)
        response.set_status(201 if created else 200)
        response.headers.update(headers)
        return response

    async def get(self, request: web.Request) -> web.Response:
        return _receipt(await self._run(request))

    async def webhook(self, request: web.Request) -> web.Response:
        """The run's webhook delivery: attempts, last answer, outcome (null: the run has none)."""
        run = await self._run(request)
        row = None
        if self.deps.webhooks.supported:
            row = await asyncio.get_running_loop().run_in_executor(
                self.deps.executor, self.deps.webhooks.storage.get_webhook, run.host_run_id
            )
        return web.json_response({"hostRunId": run.host_run_id, "webhook": delivery_view(row)})

    async def events(self, request: web.Request) -> web.Response:
        query = RUN_EVENTS.parse_query(request)
        run = await self._run(request)
        after, limit = query.afterSeq, query.limit
        project = self._projection(query.projection)
        events = await self.deps.journal.read(run.host_run_id, after, limit)
        if project is None:
            items = b"[" + b",".join(e.wire_bytes() for e in events) + b"]"
        else:
            items = dumps([p for p in (project(e) for e in events) if p is not None])
        next_cursor = format_cursor(events[-1].seq if events else after)
        done = bool(events and events[-1].is_terminal)
        head = f'{{"schema":"gateway.run_events.v1","hostRunId":"{run.host_run_id}","events":'
        tail = f',"nextCursor":"{next_cursor}","complete":{"true" if done else "false"}}}'
        return web.Response(body=head.encode() + items + tail.encode(), content_type="application/json")

    async def stream(self, request: web.Request) -> web.StreamResponse:
        query = STREAM_RUN.parse_query(request)
        run = await self._run(request)
        header = request.headers.get("Last-Event-ID")
        after = _cursor(header, "Last-Event-ID") if header else query.afterSeq
        return await self._stream(request, run, after, self._projection(query.projection))

    async def _stream(
        self,
        request: web.Request,
        run: Run,
        after: int,
        project: Any,
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> web.StreamResponse:
        return await stream_run(
            request,
            status=status,
            headers=headers,
            topic=run.host_run_id,
            after_seq=after,
            is_finished=RunEnded(run),
            project=project,
            **self.deps.streams.options(),
        )

    async def cancel(self, request: web.Request) -> web.Response:
        if self.deps.auth.authorizing:
            await self._run(request, "runs:cancel")
        run = await self.deps.runs.cancel(request.match_info["hostRunId"], request[ACTOR_ID])
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        response = _receipt(run)
        response.set_status(200 if run.is_terminal else 202)
        return response

    async def permission(self, request: web.Request) -> web.Response:
        answer = await ANSWER_PERMISSION.read_body(request)
        if self.deps.auth.authorizing:
            await self._run(request, "runs:permission")
        path = ANSWER_PERMISSION.parse_path(request)
        actor_id = request[ACTOR_ID]
        run = await self.deps.runs.resolve_permission(path.hostRunId, actor_id, path.requestId, answer.optionId)
        return _receipt(run)

    async def active_run(self, request: web.Request) -> web.Response:
        session_id = request.match_info["sessionId"]
        if self.deps.auth.authorizing:
            await self.deps.auth.authorize(request, "sessions:read", {"type": "session", "id": session_id})
        run = await self.deps.runs.active_run(request[ACTOR_ID], session_id)
        return web.json_response(
            {
                "schema": "gateway.active_run.v1",
                "sessionId": session_id,
                "run": run.to_receipt() if run else None,
            }
        )


def setup(app: web.Application, deps: RunRoutesDeps) -> None:
    routes = RunRoutes(deps)
    for route, handler in (
        (CREATE_RUN, routes.create),
        (GET_RUN, routes.get),
        (RUN_EVENTS, routes.events),
        (RUN_WEBHOOK, routes.webhook),
        (STREAM_RUN, routes.stream),
        (CANCEL_RUN, routes.cancel),
        (ANSWER_PERMISSION, routes.permission),
        (ACTIVE_RUN, routes.active_run),
    ):
        app.router.add_route(route.method, route.path, handler)
