"""``POST /v1/ag-ui/{agentId}`` (a run from an AG-UI ``RunAgentInput``, streamed as AG-UI events)
and ``GET /v1/ag-ui/runs/{runId}/stream`` (the same stream, resumed after ``Last-Event-ID``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ag_ui.core import RunAgentInput
from aiohttp import web
from pydantic import ValidationError

from agent_gateway import ApiError, read_json

from .client_tools import IGNORED_HEADER, client_tools
from .mapping import CURSOR, AgUiTranslator, Resumption, group_frames, merged_from

if TYPE_CHECKING:
    from agent_gateway import Event, PluginRoutes, Run

# Journal events read per page when a resumed stream rebuilds what the client had.
PREFIX_PAGE = 2000
# The keys of `forwardedProps.agentGateway` that go into the gateway run as they are.
GATEWAY_PROPS = ("workspaceId", "context", "options", "parentRunId", "multitaskStrategy")
MULTITASK_HEADER = "X-Agent-Gateway-Multitask"
SESSION_AFFINITY_HEADER = "X-Agent-Gateway-Session-Affinity"
MULTITASK_STRATEGIES = ["enqueue", "reject", "interrupt", "rollback"]

_ERRORS = {
    code: {"$ref": f"#/components/responses/{name}"}
    for code, name in (
        ("400", "BadRequest"),
        ("401", "Unauthorized"),
        ("403", "Forbidden"),
        ("404", "NotFound"),
        ("503", "ServiceUnavailable"),
    )
}
VISIBLE = "[^\\s\\u001c-\\u001f\\u0085\\ufeff]"  # a non-blank text, as the core's ids and messages
_ID = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": VISIBLE}
_STREAM_200 = {
    "description": "text/event-stream of AG-UI events: each frame an `id` (`<seq>`, or `<seq>:<k>` before the last "
    "frame of a journal event's group) and the official encoder's `data` line (one AG-UI event as JSON); `: ping` "
    "comments as heartbeat; the stream ends after RUN_FINISHED or RUN_ERROR",
    "content": {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "required": ["id", "data"],
                "properties": {
                    "id": {"type": "string", "pattern": "^[0-9]{18}(:[0-9]{1,6})?$"},
                    "data": {"type": "string", "contentMediaType": "application/json"},
                },
            }
        }
    },
}
_TAGS = ["AG-UI (ag_ui plugin)"]
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
_PARTS = {"type": "array", "items": _TEXT_PART}
_MESSAGE = {
    "description": "An AG-UI message (the last user message is the run's; the earlier ones choose the session of a "
    "thread the caller does not have yet: docs/sessions.md, conversation affinity; for an agent that takes client "
    "tools, the assistant tool calls and tool results after the last user message are read too)",
    "oneOf": [
        {
            "type": "object",
            "required": ["id", "role", "content"],
            "properties": {
                "id": {"type": "string"},
                "role": {"enum": ["user"]},
                "content": {"oneOf": [{"type": "string"}, _PARTS]},
            },
        },
        {
            "type": "object",
            "required": ["id", "role", "content"],
            "properties": {
                "id": {"type": "string"},
                "role": {"enum": ["system", "developer"]},
                "content": {"type": "string"},
            },
        },
        {
            "type": "object",
            "required": ["id", "role"],
            "properties": {
                "id": {"type": "string"},
                "role": {"const": "assistant"},
                "content": {"type": "string"},
                "toolCalls": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["id", "type", "function"],
                        "properties": {
                            "id": {"type": "string"},
                            "type": {"const": "function"},
                            "function": {
                                "type": "object",
                                "required": ["name", "arguments"],
                                "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                            },
                        },
                    },
                },
            },
        },
        {
            "type": "object",
            "required": ["id", "role", "content", "toolCallId"],
            "properties": {
                "id": {"type": "string"},
                "role": {"const": "tool"},
                "content": {"type": "string"},
                "toolCallId": {"type": "string"},
            },
        },
    ],
}
# The last user message with text is the run's message: at least one must have some.
_HAS_USER_TEXT = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"const": "user"},
        "content": {
            "anyOf": [
                {"type": "string", "pattern": VISIBLE},
                {
                    "type": "array",
                    "contains": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": {"type": "string", "pattern": VISIBLE}},
                    },
                },
            ]
        },
    },
}
_GATEWAY_PROPS = {
    "type": "object",
    "description": "Fields of the gateway run",
    "properties": {
        "workspaceId": _ID,
        "context": {
            "type": ["object", "null"],
            "properties": {"allowedRoots": {"type": "array", "items": {"type": "string"}}},
        },
        "options": {"type": ["object", "null"]},
        "parentRunId": {"type": ["string", "null"]},
        "multitaskStrategy": {"type": ["string", "null"], "enum": [*MULTITASK_STRATEGIES, None]},
    },
}
RUN_OPENAPI: dict[str, Any] = {
    "operationId": "agUiRun",
    "summary": "Run an agent from an AG-UI RunAgentInput and stream AG-UI events",
    "description": "threadId is the gateway session (a new thread whose input carries earlier messages goes to the "
    "caller's session those messages continue, or starts with them as history: RUN_STARTED "
    "metadata.agentGateway.sessionId and the X-Agent-Gateway-Session header say which), runId the idempotency key "
    "(requestId), the last user message with text the run's message. `forwardedProps.agentGateway` may carry "
    "workspaceId, context, options, parentRunId and multitaskStrategy for the gateway run; the "
    "`X-Agent-Gateway-Multitask` header (enqueue, reject, interrupt, rollback) wins over it. See docs/ag-ui.md.",
    "tags": _TAGS,
    "parameters": [
        {
            "name": "agentId",
            "in": "path",
            "required": True,
            "schema": {"$ref": "#/components/schemas/AgentId"},
        },
    ],
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "AG-UI RunAgentInput",
                    "required": ["threadId", "runId", "messages"],
                    "properties": {
                        "threadId": _ID,
                        "runId": _ID,
                        "parentRunId": {"type": ["string", "null"]},
                        "state": {},
                        "messages": {"type": "array", "items": _MESSAGE, "contains": _HAS_USER_TEXT},
                        "tools": {
                            "type": ["array", "null"],
                            "items": {
                                "type": "object",
                                "required": ["name", "description"],
                                "properties": {"name": {"type": "string"}, "description": {"type": "string"}},
                            },
                        },
                        "context": {
                            "type": ["array", "null"],
                            "items": {
                                "type": "object",
                                "required": ["description", "value"],
                                "properties": {"description": {"type": "string"}, "value": {"type": "string"}},
                            },
                        },
                        "forwardedProps": {
                            "description": "Any value; an object's `agentGateway` holds fields of the gateway run",
                            "if": {"type": "object"},
                            "then": {"properties": {"agentGateway": _GATEWAY_PROPS}},
                        },
                    },
                }
            }
        },
    },
    "responses": {
        "200": _STREAM_200,
        **_ERRORS,
        "409": {"$ref": "#/components/responses/Conflict"},
        "413": {"$ref": "#/components/responses/PayloadTooLarge"},
        "415": {"$ref": "#/components/responses/UnsupportedMediaType"},
        "429": {"$ref": "#/components/responses/TooManyRequests"},
    },
}
STREAM_OPENAPI: dict[str, Any] = {
    "operationId": "agUiStream",
    "summary": "Resume a run's AG-UI stream after Last-Event-ID (a prelude re-opens what the client had open)",
    "tags": _TAGS,
    "parameters": [
        {
            "name": "runId",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1},
            "description": "The gateway's hostRunId (RUN_STARTED metadata.agentGateway.hostRunId), or the AG-UI "
            "runId together with threadId",
        },
        {
            "name": "threadId",
            "in": "query",
            "schema": {"type": "string"},
            "description": "The AG-UI threadId: runId is then the AG-UI runId the client sent",
        },
        {
            "name": "workspaceId",
            "in": "query",
            "schema": {"type": "string"},
            "description": "With threadId: the workspace of the run (default `default`)",
        },
        {
            "name": "Last-Event-ID",
            "in": "header",
            "schema": {"type": "string", "pattern": "^([0-9]{1,18}(:[0-9]{1,6})?)?$"},
            "description": "The id of the last frame received: resume right after it",
        },
    ],
    "responses": {"200": _STREAM_200, **_ERRORS},
}


VISIBLE_TEXT = re.compile(VISIBLE)
NOT_IN_A_HEADER = re.compile(r"[\x00-\x1f\x7f]")


def _user_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: the text ones
        texts = [getattr(part, "text", None) for part in content]
        return "".join(t for t in texts if isinstance(t, str)) or None
    return None


def earlier_turns(body: Any) -> list[tuple[str, str]]:
    """``(role, text)`` of a ``RunAgentInput``'s messages before its last user message with text
    (already validated by :func:`run_body`): the history conversation affinity looks at."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return []
    last = 0
    for index, item in enumerate(messages):
        if isinstance(item, dict) and item.get("role") == "user":
            text = _raw_text(item.get("content"))
            if VISIBLE_TEXT.search(text):
                last = index
    return [
        (str(item.get("role")), _raw_text(item.get("content"))) for item in messages[:last] if isinstance(item, dict)
    ]


def _raw_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def run_body(agent_id: str, body: Any) -> dict[str, Any]:
    """The ``POST /v1/runs`` body of an AG-UI ``RunAgentInput``; a 400 :class:`ApiError` if it is not one."""
    try:
        run_input = RunAgentInput.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise ApiError(400, "invalid_request", f"not an AG-UI RunAgentInput: {where}: {first.get('msg')}") from None
    message = None
    for item in reversed(run_input.messages):
        if item.role == "user":
            message = _user_text(item.content)
            if message is not None and VISIBLE_TEXT.search(message):
                break
            message = None
    if not message:
        raise ApiError(400, "invalid_request", "RunAgentInput.messages holds no user message with text")
    props = run_input.forwarded_props
    gateway = props.get("agentGateway") if isinstance(props, dict) else None
    if isinstance(props, dict) and "agentGateway" in props and not isinstance(gateway, dict):
        raise ApiError(400, "invalid_request", "forwardedProps.agentGateway must be an object")
    request: dict[str, Any] = {k: gateway[k] for k in GATEWAY_PROPS if gateway and k in gateway}
    if "multitaskStrategy" in request and request["multitaskStrategy"] is None:
        del request["multitaskStrategy"]  # null is "not chosen" (the declared schema allows it): the default
    context = request.get("context", {})
    if context is None:  # as the core takes a null context
        context = {}
    if not isinstance(context, dict):
        raise ApiError(400, "invalid_request", "forwardedProps.agentGateway.context must be an object")
    # What the runtime may use from AG-UI: the client's context entries and tool declarations.
    extra = {
        "context": [c.model_dump(by_alias=True, exclude_none=True) for c in run_input.context or ()],
        "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in run_input.tools or ()],
    }
    if extra["context"] or extra["tools"]:
        context = {**context, "agUi": extra}
    request.update(
        requestId=run_input.run_id,
        agentId=agent_id,
        sessionId=run_input.thread_id,
        message=message,
        context=context,
    )
    if run_input.parent_run_id and "parentRunId" not in request:
        request["parentRunId"] = run_input.parent_run_id
    return request


class AgUiRoutes:
    def __init__(self, routes: PluginRoutes, client_tools: str = "reject") -> None:
        self.routes = routes
        self.client_tools = client_tools  # "reject" or "ignore" for an agent that cannot take them

    def _encoder(self, translator: AgUiTranslator) -> Any:
        content_frame, translate = translator.content_frame, translator.translate

        def encode(events: list[Event]) -> bytes:
            parts: list[bytes] = []
            for event in events:
                fast = content_frame(event)
                if fast is not None:
                    parts.append(fast)
                    continue
                translated = translate(event)
                if translated:
                    frames = group_frames(event.seq, translated, first_seq=merged_from(event))
                    parts.append("".join(frames).encode())
            return b"".join(parts)

        return encode

    async def create(self, request: web.Request) -> web.StreamResponse:
        raw = await read_json(request)
        body = run_body(request.match_info["agentId"], raw)
        agent = body["agentId"]
        options, ignored = client_tools(raw, self.routes.runtime(agent), self.client_tools, agent)
        if options is not None and isinstance(body.get("options") or {}, dict):
            body["options"] = {**(body.get("options") or {}), "clientTools": options}
        thread_id = body["sessionId"]
        strategy = request.headers.get(MULTITASK_HEADER)
        if strategy is not None:  # wins over forwardedProps; the core checks it (a 400 naming the strategies)
            if body.get("multitaskStrategy") not in (None, *MULTITASK_STRATEGIES):
                raise ApiError(
                    400, "invalid_request", "forwardedProps.agentGateway.multitaskStrategy is not a strategy"
                )
            body["multitaskStrategy"] = strategy.strip()
        plan = await self._conversation(request, body, earlier_turns(raw))
        body["sessionId"] = plan.session_id
        try:
            run, _created = await self.routes.create_run(request, body)
        except Exception as refused:
            await self.routes.release_conversation(plan)  # no run: the session it claimed is free
            if not isinstance(refused, ApiError) or refused.status != 429:
                raise
            response = web.json_response(
                {"error": {"code": refused.code, "message": str(refused), **refused.extra}}, status=429
            )
            response.headers["Retry-After"] = str(refused.extra.get("retryAfterSeconds", 1))
            return response
        self.routes.follow_conversation(run, plan, body["message"])
        translator = AgUiTranslator(run)
        translator.ignored = ignored
        translator.thread_id = thread_id  # as sent, whichever session the run went to
        headers = {**self._headers(run), SESSION_AFFINITY_HEADER: plan.affinity}
        if ignored:
            headers[IGNORED_HEADER] = ", ".join(ignored)
        return await self.routes.stream(request, run, encode=self._encoder(translator), headers=headers)

    async def _conversation(self, request: web.Request, body: dict[str, Any], earlier: list[tuple[str, str]]) -> Any:
        """The run's session: the thread, when the caller has it or the input carries no earlier
        turns; else the session those turns continue, or the new thread given them as its history
        (docs/sessions.md, "Conversation affinity")."""
        thread_id = body["sessionId"]
        pinned = not earlier or await self.routes.session_known(self.routes.actor(request), thread_id)
        return await self.routes.conversation(
            request,
            body["agentId"],
            earlier,
            session_id=thread_id if pinned else None,
            new_session_id=thread_id,
            claimer=f"ag-ui:{thread_id}:{body['requestId']}",
        )

    @staticmethod
    def _headers(run: Run) -> dict[str, str]:
        headers = {
            "X-Agent-Gateway-Run-Id": run.host_run_id,
            "Content-Location": f"/v1/ag-ui/runs/{run.host_run_id}/stream",
        }
        # A thread id with a control character (the caller's own bytes) cannot be a header value:
        # aiohttp would refuse the whole response. RUN_STARTED's metadata still carries it.
        if not NOT_IN_A_HEADER.search(run.session_id):
            headers["X-Agent-Gateway-Session"] = run.session_id
        return headers

    async def _find(self, request: web.Request) -> Run:
        actor = self.routes.actor(request)
        run_id = request.match_info["runId"]
        thread_id = request.query.get("threadId")
        if thread_id:
            workspace_id = request.query.get("workspaceId") or "default"
            run = await self.routes.run_by_request(actor, thread_id, run_id, workspace_id)
        else:
            run = await self.routes.run(run_id, actor)
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        return run

    async def resume(self, request: web.Request) -> web.StreamResponse:
        run = await self._find(request)
        cursor = request.headers.get("Last-Event-ID", "").strip()
        match = CURSOR.fullmatch(cursor) if cursor else None
        if cursor and match is None:
            raise ApiError(400, "invalid_cursor", "Last-Event-ID: a seq (up to 18 digits), optionally ':<k>'")
        translator = AgUiTranslator(run)
        after, head = 0, b""
        if match is not None:
            after = int(match.group(1))
            cut = int(match.group(2)) if match.group(2) is not None else None
            head = await self._rebuild(run, translator, after, cut, cursor)
        return await self.routes.stream(
            request, run, encode=self._encoder(translator), after_seq=after, prelude=head, headers=self._headers(run)
        )

    async def _rebuild(self, run: Run, translator: AgUiTranslator, after: int, cut: int | None, cursor: str) -> bytes:
        """What a resumed stream sends first, from the journal up to seq ``after`` (see Resumption)."""
        resumption = Resumption(translator, after, cut)
        seen = 0
        for _page in range(after // PREFIX_PAGE + 2):  # bounded: seqs are at most `after` here
            events = await self.routes.events(run, seen, PREFIX_PAGE)
            for event in events:
                if event.seq > after:
                    break
                resumption.feed(event)
            if not events or events[-1].seq >= after or len(events) < PREFIX_PAGE:
                break
            seen = events[-1].seq
        return resumption.head(cursor)


def setup(routes: PluginRoutes, client_tools: str = "reject") -> None:
    handlers = AgUiRoutes(routes, client_tools)
    routes.add("POST", "/v1/ag-ui/{agentId}", handlers.create, openapi=RUN_OPENAPI)
    routes.add("GET", "/v1/ag-ui/runs/{runId}/stream", handlers.resume, openapi=STREAM_OPENAPI)
