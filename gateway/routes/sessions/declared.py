"""The /v1/sessions routes, declared once (:mod:`agent_gateway.declare`): their path, query and
body models (whose validators keep the refusals the routes always had: ``invalid_limit``,
``invalid_session_id``, ...) and their response bodies, from which ``/openapi.json`` lists them."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from agent_gateway.api_models import Run
from agent_gateway.declare import VISIBLE, VISIBLE_PATTERN, Route, RouteResponse, refuse
from agent_gateway.models import ACTIVE_STATUSES, TERMINAL_STATUSES

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
MAX_QUERY = 500
MAX_BULK = 100
MAX_ID_LENGTH = 200
STATUS_FILTERS = frozenset({"active", *ACTIVE_STATUSES, *TERMINAL_STATUSES})
# What encode_cursor writes: unpadded URL-safe base64.
CURSOR_PATTERN = "^[A-Za-z0-9_-]{0,1000}$"  # empty: the first page
CURSOR_SHAPE = re.compile(CURSOR_PATTERN)
# Request models: strict, unknown fields refused; built on first use, not at import.
REQUEST = ConfigDict(extra="forbid", strict=True, defer_build=True)
RESPONSE = ConfigDict(defer_build=True)


# -- input ------------------------------------------------------------------------------------------
def session_id_problem(value: Any, name: str = "session id") -> str | None:
    """The rule runs use for their ids (at least one visible character), plus what no storage
    backend can hold (NUL, a lone surrogate)."""
    if not isinstance(value, str) or not VISIBLE.search(value):
        return f"a {name} must be a string with a visible character"
    if len(value) > MAX_ID_LENGTH:
        return f"a {name} must be at most {MAX_ID_LENGTH} characters"
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return f"a {name} must not contain NUL or a lone surrogate"
    return None


def _session_id(value: Any) -> Any:
    problem = session_id_problem(value)
    if problem:
        raise refuse("invalid_session_id", problem)
    return value


SessionId = Annotated[
    str,
    Field(min_length=1, max_length=MAX_ID_LENGTH, json_schema_extra={"pattern": VISIBLE_PATTERN}),
    BeforeValidator(_session_id),
]


class SessionPath(BaseModel):
    model_config = REQUEST
    sessionId: SessionId


def _limit(value: Any) -> Any:
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise refuse("invalid_limit", "limit must be an integer") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise refuse("invalid_limit", f"limit must be 1..{MAX_LIMIT}")
    return limit


def _search(value: Any) -> Any:
    text = value.strip() if isinstance(value, str) else value
    if not isinstance(text, str) or len(text) > MAX_QUERY or "\x00" in text:
        raise refuse("invalid_query", f"q must be at most {MAX_QUERY} characters, without NUL")
    return text


def _agent_filter(value: Any) -> Any:
    if value == "":  # a filter: any id, "" for none
        return None
    if not isinstance(value, str) or len(value) > MAX_ID_LENGTH or "\x00" in value:
        raise refuse("invalid_agent_id", f"agentId must be at most {MAX_ID_LENGTH} characters, without NUL")
    return value


def _status_filter(value: Any) -> Any:
    if value == "":
        return None
    if value not in STATUS_FILTERS:
        raise refuse("invalid_status", "unknown status filter", known=sorted(STATUS_FILTERS))
    return value


def _cursor(value: Any) -> Any:
    if value == "":  # the first page
        return None
    if not isinstance(value, str) or not CURSOR_SHAPE.fullmatch(value):
        raise refuse("invalid_cursor", "cursor: not a cursor this API returned")
    return value


class ListSessionsQuery(BaseModel):
    model_config = REQUEST
    q: Annotated[str, Field(max_length=MAX_QUERY), BeforeValidator(_search)] = ""
    agentId: Annotated[Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None, BeforeValidator(_agent_filter)] = None
    status: Annotated[
        Annotated[str, Field(json_schema_extra={"enum": sorted(STATUS_FILTERS)})] | None,
        BeforeValidator(_status_filter),
    ] = None
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT), BeforeValidator(_limit)] = DEFAULT_LIMIT
    cursor: Annotated[Annotated[str, Field(pattern=CURSOR_PATTERN)] | None, BeforeValidator(_cursor)] = None


def _format(value: Any) -> Any:
    if value not in ("json", "markdown"):
        raise refuse("invalid_format", "format must be json or markdown")
    return value


class ExportQuery(BaseModel):
    model_config = REQUEST
    format: Annotated[Literal["json", "markdown"], BeforeValidator(_format)] = "json"


def _title(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or len(value) > 200):
        raise refuse("invalid_request", 'title must be a string of at most 200 characters ("": default)')
    return value


def _pinned(value: Any) -> Any:
    if value is not None and not isinstance(value, bool):
        raise refuse("invalid_request", "pinned must be true or false")
    return value


class SessionPatch(BaseModel):
    """Rename (title; empty: the default) and/or pin a session; null leaves a field as it is."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True, json_schema_extra={"minProperties": 1})
    title: Annotated[Annotated[str, Field(max_length=200)] | None, BeforeValidator(_title)] = None
    pinned: Annotated[bool | None, BeforeValidator(_pinned)] = None

    @model_validator(mode="before")
    @classmethod
    def _an_object_with_a_field(cls, body: Any) -> Any:
        if not isinstance(body, dict) or not body:
            raise refuse("invalid_request", 'send {"title": "...", "pinned": true|false}')
        return body


class DeleteSessions(BaseModel):
    """The sessions to delete: all of them, or none if one has an active run."""

    model_config = REQUEST
    sessionIds: Annotated[list[SessionId], Field(min_length=1, max_length=MAX_BULK)]

    @model_validator(mode="before")
    @classmethod
    def _a_list_of_ids(cls, body: Any) -> Any:
        ids = body.get("sessionIds") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or len(ids) > MAX_BULK or set(body) != {"sessionIds"}:
            raise refuse("invalid_request", f'send {{"sessionIds": [...]}} with 1..{MAX_BULK} ids')
        return body


# -- output (documentation: the handlers build these bodies as dicts) -------------------------------
class SessionSummary(BaseModel):
    model_config = RESPONSE
    sessionId: str
    workspaceId: str
    agentId: str
    agentName: str | None
    profile: str | None
    model: str | None
    title: str
    titleCustom: bool
    pinned: bool
    runCount: int
    messageCount: int
    toolCount: int
    sessionMode: str | None
    lastStatus: str | None
    lastRunId: str | None
    activeRun: Run | None
    createdAt: int
    updatedAt: int
    snippet: str = Field("", description="search only: HTML-escaped text, hits in <mark>")
    score: float = Field(0, description="search only: the engine's rank")


class SessionPage(BaseModel):
    model_config = RESPONSE
    schema_: Literal["gateway.sessions.v1"] = Field(alias="schema")
    sessions: list[SessionSummary]
    nextCursor: str | None


class Transcript(BaseModel):
    """gateway.transcript.v1: one run's response projection (docs/sessions.md)"""

    model_config = ConfigDict(extra="allow", defer_build=True)
    schema_: Literal["gateway.transcript.v1"] = Field(alias="schema")
    hostRunId: str | None
    question: str | None
    status: str
    answer: dict[str, Any]
    thoughts: dict[str, Any]
    tools: list[dict[str, Any]]
    plan: dict[str, Any] | None
    permissions: list[dict[str, Any]]
    citations: list[dict[str, Any]]
    files: list[dict[str, Any]]
    sessionMode: str | None
    modeHistory: list[dict[str, Any]]


class SessionRun(BaseModel):
    model_config = RESPONSE
    receipt: Run
    transcript: Transcript
    events: list[dict[str, Any]] = Field(
        default_factory=list, description="export only: the run's journal events (gateway.event.v1)"
    )


class SessionDetail(BaseModel):
    model_config = RESPONSE
    schema_: Literal["gateway.session.v1", "gateway.session_export.v1"] = Field(alias="schema")
    session: SessionSummary
    binding: dict[str, Any]
    runs: list[SessionRun]


class SessionUpdated(BaseModel):
    model_config = RESPONSE
    schema_: Literal["gateway.session_summary.v1"] = Field(alias="schema")
    session: SessionSummary


class SessionsDeleted(BaseModel):
    model_config = RESPONSE
    schema_: Literal["gateway.sessions_deleted.v1"] = Field(alias="schema")
    deleted: list[str]
    notFound: list[str]


class AgentSessionDeleted(BaseModel):
    model_config = RESPONSE
    schema_: Literal["gateway.agent_session_deleted.v1"] = Field(alias="schema")
    agentId: str
    agentSessionId: str


# -- the routes -------------------------------------------------------------------------------------
# What every sessions route can answer besides its own statuses; and a route that reads a body.
ERRORS = (400, 401, 403, 404, 503)
BODY_ERRORS = (413, 415)
ONE = "/v1/sessions/{sessionId}"

LIST: Route[Any, ListSessionsQuery] = Route(
    "GET",
    "/v1/sessions",
    "The caller's sessions: pinned first, then most recently updated; with q, a ranked search",
    operation_id="listSessions",
    query=ListSessionsQuery,
    responses={200: RouteResponse("A page of sessions", SessionPage)},
    errors=ERRORS,
)
BULK_DELETE: Route[DeleteSessions, Any] = Route(
    "POST",
    "/v1/sessions:delete",
    "Delete the gateway's history of several sessions (all refused if one has an active run)",
    operation_id="deleteSessions",
    body=DeleteSessions,
    responses={200: RouteResponse("What was deleted", SessionsDeleted)},
    errors=(*ERRORS, 409, *BODY_ERRORS),
)
GET: Route[Any, Any, SessionPath] = Route(
    "GET",
    ONE,
    "A session: its runs' transcripts in order and the runtime binding",
    operation_id="getSession",
    params=SessionPath,
    responses={200: RouteResponse("The session", SessionDetail)},
    errors=ERRORS,
)
PATCH: Route[SessionPatch, Any, SessionPath] = Route(
    "PATCH",
    ONE,
    "Rename (title; empty: the default) and/or pin a session",
    operation_id="updateSession",
    params=SessionPath,
    body=SessionPatch,
    responses={200: RouteResponse("The updated summary", SessionUpdated)},
    errors=(*ERRORS, *BODY_ERRORS),
)
DELETE: Route[Any, Any, SessionPath] = Route(
    "DELETE",
    ONE,
    "Delete the gateway's history of a session (never the agent's own store)",
    operation_id="deleteSession",
    params=SessionPath,
    responses={200: RouteResponse("Deleted", SessionsDeleted)},
    errors=(*ERRORS, 409),
)
EXPORT: Route[Any, ExportQuery, SessionPath] = Route(
    "GET",
    ONE + "/export",
    "Export a session: runs, transcripts, events and binding (json) or a readable document",
    operation_id="exportSession",
    params=SessionPath,
    query=ExportQuery,
    responses={
        200: RouteResponse("The export", SessionDetail, content={"text/markdown": {"schema": {"type": "string"}}})
    },
    errors=ERRORS,
)
DELETE_AGENT_SESSION: Route[Any, Any, SessionPath] = Route(
    "DELETE",
    ONE + "/agent-session",
    "Ask the agent to delete its own session (only when the runtime declares it can)",
    operation_id="deleteAgentSession",
    params=SessionPath,
    responses={
        200: RouteResponse("Deleted by the agent", AgentSessionDeleted),
        502: RouteResponse(
            "the agent could not delete its session",
            content={"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        ),
    },
    errors=(*ERRORS, 409),
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (LIST, BULK_DELETE, GET, PATCH, DELETE, EXPORT, DELETE_AGENT_SESSION)
