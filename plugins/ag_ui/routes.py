"""``POST /v1/ag-ui/{agentId}`` (a run from an AG-UI ``RunAgentInput``, streamed as AG-UI events)
and ``GET /v1/ag-ui/runs/{runId}/stream`` (the same stream, resumed after ``Last-Event-ID``), as
declared in :mod:`.declared`. The AG-UI SDK (``ag_ui``, in :mod:`.mapping`) is imported when a
stream is first encoded, not at start-up."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent_gateway import ApiError, read_json

from .client_tools import IGNORED_HEADER, client_tools
from .declared import RESUME, RUN, AgUiRunInput

if TYPE_CHECKING:
    from agent_gateway import Event, PluginRoutes, Run

    from .mapping import AgUiTranslator

# Journal events read per page when a resumed stream rebuilds what the client had.
PREFIX_PAGE = 2000
MULTITASK_HEADER = "X-Agent-Gateway-Multitask"
SESSION_AFFINITY_HEADER = "X-Agent-Gateway-Session-Affinity"
NOT_IN_A_HEADER = re.compile(r"[\x00-\x1f\x7f]")
NOT_AN_INPUT = "not an AG-UI RunAgentInput: "


def parse_input(body: Any) -> AgUiRunInput:
    """``body`` as the declared ``RunAgentInput``; a 400 naming the field (``not an AG-UI
    RunAgentInput: ...``), or the declaration's own refusal."""
    try:
        return RUN.parse_body(body)
    except ApiError as exc:
        named = "field" in exc.extra or str(exc) == "the body must be a JSON object"
        if exc.code == "invalid_request" and named:
            raise ApiError(400, exc.code, NOT_AN_INPUT + str(exc), **exc.extra) from None
        raise  # a validator's own refusal: its whole message


def run_body(agent_id: str, run_input: AgUiRunInput) -> dict[str, Any]:
    """The ``POST /v1/runs`` body of a valid ``RunAgentInput``."""
    gateway = run_input.gateway_props
    request: dict[str, Any] = gateway.run_fields() if gateway is not None else {}
    context = request.get("context") or {}  # (null: as the core takes it)
    # What the runtime may use from AG-UI: the client's context entries and tool declarations.
    extra = {
        "context": [c.model_dump(exclude_none=True) for c in run_input.context or ()],
        "tools": [t.model_dump(exclude_none=True) for t in run_input.tools or ()],
    }
    if extra["context"] or extra["tools"]:
        context = {**context, "agUi": extra}
    request.update(
        requestId=run_input.runId,
        agentId=agent_id,
        sessionId=run_input.threadId,
        message=run_input.message,
        context=context,
    )
    if run_input.parentRunId and "parentRunId" not in request:
        request["parentRunId"] = run_input.parentRunId
    return request


class AgUiRoutes:
    def __init__(self, routes: PluginRoutes, client_tools: str = "reject") -> None:
        self.routes = routes
        self.client_tools = client_tools  # "reject" or "ignore" for an agent that cannot take them

    def _encoder(self, translator: AgUiTranslator) -> Any:
        from .mapping import group_frames, merged_from

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
        agent = RUN.parse_path(request).agentId
        run_input = parse_input(await read_json(request))
        body = run_body(agent, run_input)
        options, ignored = client_tools(run_input, self.routes.runtime(agent), self.client_tools, agent)
        if options is not None and isinstance(body.get("options") or {}, dict):
            body["options"] = {**(body.get("options") or {}), "clientTools": options}
        thread_id = body["sessionId"]
        strategy = request.headers.get(MULTITASK_HEADER)
        if strategy is not None:  # wins over forwardedProps; the core checks it (a 400 naming the strategies)
            body["multitaskStrategy"] = strategy.strip()
        plan = await self._conversation(request, body, run_input.earlier_turns)
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
        from .mapping import AgUiTranslator

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
        run_id = RESUME.parse_path(request).runId
        query = RESUME.parse_query(request)
        thread_id = query.threadId
        if thread_id:
            workspace_id = query.workspaceId or "default"
            run = await self.routes.run_by_request(actor, thread_id, run_id, workspace_id)
        else:
            run = await self.routes.run(run_id, actor)
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        return run

    async def resume(self, request: web.Request) -> web.StreamResponse:
        from .mapping import CURSOR, AgUiTranslator

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
        from .mapping import Resumption

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
    routes.add(RUN, handlers.create)
    routes.add(RESUME, handlers.resume)
