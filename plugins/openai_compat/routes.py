"""The OpenAI-compatible routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/responses``.

Each request becomes an ordinary gateway run (``PluginRoutes.create_run``): ``model`` is the agent
id, the last user message is the run's message, and the session comes from the
``X-Agent-Gateway-Session`` header, ``metadata.session_id``, ``previous_response_id`` (responses)
or ``user``, in that order; without any, from the conversation the request resends (the session
whose last turn it ends with, else a new one given that history: docs/sessions.md). The session
used is the ``X-Agent-Gateway-Session`` header of the answer. What a request
does while the session still answers comes from the ``X-Agent-Gateway-Multitask`` header or
``metadata.multitask_strategy`` (the run's ``multitaskStrategy``). Streams are the
run's journal through :mod:`.mapping`'s encoders, so every response can be resumed.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

from aiohttp import web

from agent_gateway import VISIBLE, ApiError, ConversationPlan, Event, PluginRoutes, Run, read_json

from .chat_api import CHAT_COMPLETIONS, GET_MODEL, LIST_MODELS
from .client_tools import ClientToolsRequest
from .common import AFFINITY_HEADER, IDEMPOTENCY_HEADER, IGNORED_HEADER, MAX_ID_LENGTH, MULTITASK_HEADER, SESSION_HEADER
from .conversation import chat_earlier, input_earlier
from .mapping import (
    CLIENT_TOOL_CALL,
    RESPONSE_PREFIX,
    RESPONSE_STATUS,
    ChatCompletion,
    ResponseStream,
    client_tool_call,
)
from .responses_api import (
    CANCEL_RESPONSE,
    CREATE_RESPONSE,
    GET_RESPONSE,
    InputItem,
    ResponseCreateRequest,
    ResponseFunctionCall,
    ResponseFunctionCallOutput,
    ResponseInputMessage,
    ResponseItemReference,
)

# Pages of events read for a non-streamed answer; bounded in count so no loop runs forever.
EVENT_PAGE = 5000
MAX_EVENT_PAGES = 2000
# `item_reference`s to the gateway's own answers resolved per response request (affinity)
MAX_REFERENCES = 200
MESSAGE_ITEM_PREFIX = "msg_"
# The parts of a response's last user message that are its text (earlier turns count output_text too).
INPUT_USER_PARTS = frozenset({"input_text", "text"})


def invalid(message: str, param: str | None) -> ApiError:
    return ApiError(400, "invalid_request", message, param=param)


# The checks the declarations do not make: an id the request names (a header, or a field whose
# model does not require a visible character) and the run's message.
def _id_text(value: str, param: str) -> str:
    if not VISIBLE.search(value) or len(value) > MAX_ID_LENGTH:
        raise invalid(f"{param} must hold a visible character and at most {MAX_ID_LENGTH} characters", param)
    return value


def _message(text: str, param: str) -> str:
    if not VISIBLE.search(text):
        raise invalid("the last user message must hold some text", param)
    return text


class OpenAIRoutes:
    def __init__(self, routes: PluginRoutes, *, reasoning: bool, client_tools: str = "reject") -> None:
        self.routes = routes
        self.reasoning = reasoning
        self.client_tools = client_tools  # "reject" or "ignore" for an agent that cannot take them

    def _client_tools(self, agent: str, asked: ClientToolsRequest) -> tuple[dict[str, Any] | None, list[str]]:
        """The run's ``options`` for the client tools ``asked`` (None: none to pass) and what the
        run ignores of them; a 400 ``tools_not_supported`` for an agent that cannot take them."""
        ignored = asked.check(self.routes.runtime(agent), self.client_tools, agent)
        if not asked or ignored:
            return None, ignored
        return {"clientTools": asked.options()}, ignored

    # -- shared ---------------------------------------------------------------------------------------
    async def _available(self, model: str) -> None:
        """A 404 for an unknown model, a 503 ``agent_unavailable`` (with what to install or set)
        for one that cannot run here; checked before any run or session exists."""
        if self.routes.runtime(model) is None:
            raise ApiError(404, "model_not_found", f"the model {model[:100]!r} does not exist", param="model")
        availability = await self.routes.availability(model)
        if not availability["available"]:
            reason = availability.get("reason") or "the agent is unavailable"
            error = ApiError(503, "agent_unavailable", f"the model {model!r} is unavailable: {reason}", param="model")
            error.headers = {"x-should-retry": "false"}  # nothing changes until an operator acts
            raise error

    def _session(self, request: web.Request, body: dict[str, Any], fallback: str | None = None) -> str | None:
        """The session the request names, or None (then its history chooses: `_conversation`).
        ``body`` is one its route's declaration accepted (``metadata`` strings, ``user`` a string)."""
        metadata, user = body.get("metadata"), body.get("user")
        header = request.headers.get(SESSION_HEADER)
        if header is not None:
            return _id_text(header, SESSION_HEADER)
        if metadata and "session_id" in metadata:
            return _id_text(metadata["session_id"], "metadata.session_id")
        if fallback is not None:
            return fallback
        if user:
            return _id_text(user, "user")
        return None

    async def _conversation(
        self,
        request: web.Request,
        agent: str,
        body: dict[str, Any],
        earlier: list[tuple[str, str]],
        fallback: str | None = None,
    ) -> ConversationPlan:
        """The run's session: the one the request names, else the one its history continues, else
        a new one holding that history (docs/sessions.md, "Conversation affinity")."""
        key = request.headers.get(IDEMPOTENCY_HEADER)
        # A new session of a keyed request is named after the key: its retry finds the same run.
        fresh = hashlib.sha256(key.encode()).hexdigest()[:32] if key is not None else uuid.uuid4().hex
        return await self.routes.conversation(
            request,
            agent,
            earlier,
            session_id=self._session(request, body, fallback),
            new_session_id="openai-" + fresh,
            claimer=f"openai:{key}" if key is not None else None,
        )

    def _workspace(self, body: dict[str, Any]) -> str:
        metadata = body.get("metadata") or {}
        workspace = metadata.get("workspace_id", "default")
        return _id_text(workspace, "metadata.workspace_id")

    def _allowed_roots(self, body: dict[str, Any]) -> list[str] | None:
        """``metadata.allowed_roots``: the workspace folders the agent's tools may touch,
        comma-separated (``""`` or ``"."``: the whole workspace); without it, none."""
        metadata = body.get("metadata") or {}
        if "allowed_roots" not in metadata:
            return None
        return [root.strip() for root in metadata["allowed_roots"].split(",")]

    async def _create(
        self,
        request: web.Request,
        agent: str,
        session: str,
        body: dict[str, Any],
        message: str,
        options: dict[str, Any] | None = None,
    ) -> Run:
        key = request.headers.get(IDEMPOTENCY_HEADER)
        run_request: dict[str, Any] = {
            "requestId": _id_text(key, IDEMPOTENCY_HEADER) if key is not None else "openai-" + uuid.uuid4().hex,
            "agentId": agent,
            "sessionId": session,
            "workspaceId": self._workspace(body),
            "message": message,
        }
        if options is not None:
            run_request["options"] = options
        roots = self._allowed_roots(body)
        if roots is not None:
            run_request["context"] = {"allowedRoots": roots}
        strategy = request.headers.get(MULTITASK_HEADER) or (body.get("metadata") or {}).get("multitask_strategy")
        if strategy is not None:  # checked by the core (a 400 naming the strategies)
            run_request["multitaskStrategy"] = strategy.strip()
        run, _ = await self.routes.create_run(request, run_request)
        return run

    async def _create_for(
        self,
        request: web.Request,
        agent: str,
        plan: ConversationPlan,
        body: dict[str, Any],
        message: str,
        options: dict[str, Any] | None = None,
    ) -> Run:
        """`_create` in the plan's session; a refusal releases the session the plan claimed."""
        try:
            return await self._create(request, agent, plan.session_id, body, message, options)
        except Exception:
            await self.routes.release_conversation(plan)
            raise

    async def _all_events(self, run: Run) -> list[Event]:
        events: list[Event] = []
        after = 0
        for _ in range(MAX_EVENT_PAGES):
            page = await self.routes.events(run, after, EVENT_PAGE)
            events.extend(page)
            if len(page) < EVENT_PAGE:
                break
            after = page[-1].seq
        return events

    async def _run_of_response(self, request: web.Request, response_id: str, param: str = "response_id") -> Run:
        run = None
        if response_id.startswith(RESPONSE_PREFIX):
            run = await self.routes.run(response_id.removeprefix(RESPONSE_PREFIX), self.routes.actor(request))
        if run is None:
            raise ApiError(404, "response_not_found", f"no response with id {response_id[:100]!r}", param=param)
        return run

    # -- /v1/models -----------------------------------------------------------------------------------
    def _model_object(self, agent_id: str) -> dict[str, Any]:
        return {"id": agent_id, "object": "model", "created": 0, "owned_by": "agent-gateway"}

    async def list_models(self, request: web.Request) -> web.Response:
        # Only agents that can run: an OpenAI client offers every listed model to its user.
        models = [
            self._model_object(agent)
            for agent in self.routes.agent_ids()
            if (await self.routes.availability(agent))["available"]
        ]
        return web.json_response({"object": "list", "data": models})

    async def get_model(self, request: web.Request) -> web.Response:
        model = GET_MODEL.parse_path(request).model
        await self._available(model)
        return web.json_response(self._model_object(model))

    # -- /v1/chat/completions -------------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        named = body.get("model") if isinstance(body, dict) else None
        if isinstance(named, str) and named:  # an unknown model is a 404 whatever else the body holds
            await self._available(named)
        chat = CHAT_COMPLETIONS.parse_body(body)  # a 400 naming the field as OpenAI does: messages[0].content
        agent, message, last_user = chat.model, chat.message, chat.last_user
        include_usage = chat.stream_options is not None and chat.stream_options.include_usage
        # (the shared helpers read the body as sent: it is valid now)
        messages: list[dict[str, Any]] = body["messages"]
        asked = ClientToolsRequest.from_chat(body, messages, last_user)
        options, ignored = self._client_tools(agent, asked)
        plan = await self._conversation(request, agent, body, chat_earlier(messages, last_user))
        run = await self._create_for(request, agent, plan, body, message, options)
        self.routes.follow_conversation(run, plan, message)
        headers = _session_headers(run, plan)
        if ignored:
            headers[IGNORED_HEADER] = ", ".join(ignored)
        completion = ChatCompletion(run, reasoning=self.reasoning, include_usage=include_usage, ignored=ignored)
        if chat.stream:
            # Chat chunks are not numbered: a slow client may get merged deltas (same text).
            return await self.routes.stream(request, run, encode=completion.encode, headers=headers)
        run = await self.routes.wait_run(run)
        result = completion.result(await self._all_events(run))
        if completion.status in ("failed", "interrupted"):
            error = {"message": completion.failure, "type": "server_error", "param": None}
            error["code"] = f"run_{completion.status}"
            # Not retried by the SDK: a retry would be a new turn of the same session.
            return web.json_response({"error": error}, status=502, headers={"x-should-retry": "false", **headers})
        return web.json_response(result, headers=headers)

    # -- /v1/responses --------------------------------------------------------------------------------
    @staticmethod
    def _last_user(items: list[InputItem]) -> int:
        """The index of the last user message among ``items``, or -1."""
        users = (i for i, item in enumerate(items) if isinstance(item, ResponseInputMessage) and item.role == "user")
        return max(users, default=-1)

    def _input_text(self, body: ResponseCreateRequest) -> str:
        if isinstance(body.input, str):
            return _message(body.input, "input")
        last_user = self._last_user(body.input)
        if last_user < 0:
            raise invalid("input must hold a user message", "input")
        item = body.input[last_user]
        assert isinstance(item, ResponseInputMessage)  # (what _last_user finds)
        return _message(item.text(INPUT_USER_PARTS), f"input[{last_user}].content")

    async def _tool_results_only(self, request: web.Request, body: ResponseCreateRequest) -> tuple[str, Run] | None:
        """A response continued by ``previous_response_id`` whose input holds tool results and no
        user message (a client that lets the server keep the conversation): the earlier
        response's question and run, whose function calls these results answer; else None."""
        items, previous = body.items, body.previous_response_id
        if previous is None or not items:
            return None
        if any(isinstance(item, ResponseInputMessage) and item.role == "user" for item in items):
            return None
        if not any(isinstance(item, ResponseFunctionCallOutput) for item in items):
            return None
        run = await self._run_of_response(request, previous, "previous_response_id")
        return str(run.request.get("message", "")), run

    async def _earlier_calls(self, run: Run) -> list[InputItem]:
        """The ``function_call`` input items of the client tools ``run``'s model asked for."""
        calls: list[InputItem] = []
        for event in await self._all_events(run):
            call = client_tool_call(event.payload) if event.kind == CLIENT_TOOL_CALL else None
            if call is not None:  # (the gateway's own record: not validated again)
                item = ResponseFunctionCall.model_construct(
                    type="function_call", call_id=call["id"], name=call["name"], arguments=call["arguments"]
                )
                calls.append(item)
        return calls

    async def _referenced(self, request: web.Request, items: list[InputItem]) -> list[InputItem]:
        """``items`` with each ``item_reference`` to one of the caller's answers (``msg_<run>``)
        replaced by that message item. A client that lets the server store its items (the Vercel AI
        SDK's OpenAI provider, ``store`` on by default) resends earlier answers as references only:
        resolved, they count as the history for conversation affinity. Other references (unknown,
        another actor's, not a message) stay as sent and are ignored, as before."""
        resolved: list[InputItem] = []
        answers: dict[str, ResponseInputMessage] = {}
        looked_up: set[str] = set()
        for item in items:
            reference = item.id if isinstance(item, ResponseItemReference) else None
            if reference is not None and reference.startswith(MESSAGE_ITEM_PREFIX):
                # each lookup reads a run's journal: bounded per request
                if reference not in looked_up and len(looked_up) < MAX_REFERENCES:
                    looked_up.add(reference)
                    run = await self.routes.run(reference.removeprefix(MESSAGE_ITEM_PREFIX), self.routes.actor(request))
                    if run is not None:
                        for output in self._response(run, await self._all_events(run))["output"]:
                            if output.get("type") == "message":
                                answers[output["id"]] = ResponseInputMessage.model_validate(output)
                item = answers.get(reference, item)
            resolved.append(item)
        return resolved

    def _response(self, run: Run, events: list[Event], ignored: list[str] | None = None) -> dict[str, Any]:
        stream = ResponseStream(run, reasoning=self.reasoning, ignored=ignored)
        stream.fold(events)
        body = stream.response()
        if not run.is_terminal:  # the run's record is ahead of its journal on queued / running
            body["status"] = RESPONSE_STATUS.get(run.status, body["status"])
        return body

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        raw = await read_json(request)
        body = CREATE_RESPONSE.parse_body(raw)
        await self._available(body.model)
        agent = body.model
        continued = await self._tool_results_only(request, body)
        if continued is None:
            message = self._input_text(body)
            asked = ClientToolsRequest.from_responses(body, body.items, self._last_user(body.items))
        else:
            message, earlier = continued
            asked = ClientToolsRequest.from_responses(body, [*await self._earlier_calls(earlier), *body.items], -1)
        options, ignored = self._client_tools(agent, asked)
        fallback = None
        if body.previous_response_id is not None:
            previous = await self._run_of_response(request, body.previous_response_id, "previous_response_id")
            fallback = previous.session_id
        history = input_earlier(await self._referenced(request, body.items))
        # (the shared session and run helpers read the body as sent, which the declaration checked)
        plan = await self._conversation(request, agent, raw, history, fallback)
        run = await self._create_for(request, agent, plan, raw, message, options)
        self.routes.follow_conversation(run, plan, message)
        headers = _session_headers(run, plan)
        if ignored:
            headers[IGNORED_HEADER] = ", ".join(ignored)
        if body.stream:
            encoder = ResponseStream(run, reasoning=self.reasoning, ignored=ignored)
            return await self.routes.stream(request, run, encode=encoder.encode, merge_deltas=False, headers=headers)
        if not body.background:
            run = await self.routes.wait_run(run)
        return web.json_response(self._response(run, await self._all_events(run), ignored), headers=headers)

    async def get_response(self, request: web.Request) -> web.StreamResponse:
        path = GET_RESPONSE.parse_path(request)
        run = await self._run_of_response(request, path.response_id)
        query = GET_RESPONSE.parse_query(request)
        if query.stream:
            after = query.starting_after if query.starting_after is not None else -1
            encoder = ResponseStream(run, reasoning=self.reasoning, starting_after=after)
            if after >= 0 and run.is_terminal:  # an ended run may be compacted: cut inside a delta?
                point = ResponseStream(run, reasoning=self.reasoning).resume_point(await self._all_events(run), after)
                if point is not None:
                    has, compacted = point
                    cut = await self.routes.events(run, has, 1)  # the journal cuts it after `has`
                    if cut and cut[0].seq == compacted:
                        encoder.cut_texts[compacted] = str(cut[0].payload.get("text", ""))
            return await self.routes.stream(request, run, encode=encoder.encode, merge_deltas=False)
        return web.json_response(self._response(run, await self._all_events(run)))

    async def cancel_response(self, request: web.Request) -> web.Response:
        run = await self._run_of_response(request, CANCEL_RESPONSE.parse_path(request).response_id)
        await self.routes.cancel_run(run.host_run_id, run.actor_id)
        run = await self.routes.wait_run(run)  # the cancel grace bounds this
        return web.json_response(self._response(run, await self._all_events(run)))


# Characters no HTTP header may carry (aiohttp refuses to send the whole response otherwise).
NOT_IN_A_HEADER = re.compile(r"[\x00-\x1f\x7f]")


def _session_headers(run: Run, plan: ConversationPlan) -> dict[str, str]:
    """The session the run went to, and how it was chosen (pinned, continued, new, fresh). A session
    id with a control character in it (the caller's own bytes) stays out of the header; the body's
    ``agent_gateway.sessionId`` / ``metadata.session_id`` still carry it."""
    headers = {AFFINITY_HEADER: plan.affinity}
    if not NOT_IN_A_HEADER.search(run.session_id):
        headers[SESSION_HEADER] = run.session_id
    return headers


def setup(routes: PluginRoutes, *, reasoning: bool, client_tools: str = "reject") -> None:
    handlers = OpenAIRoutes(routes, reasoning=reasoning, client_tools=client_tools)
    routes.add(LIST_MODELS, handlers.list_models)
    routes.add(GET_MODEL, handlers.get_model)
    routes.add(CHAT_COMPLETIONS, handlers.chat_completions)
    routes.add(CREATE_RESPONSE, handlers.create_response)
    routes.add(GET_RESPONSE, handlers.get_response)
    routes.add(CANCEL_RESPONSE, handlers.cancel_response)
