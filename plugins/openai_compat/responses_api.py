"""The Responses API routes declared once: ``POST /v1/responses``, ``GET /v1/responses/{response_id}``
and ``POST /v1/responses/{response_id}/cancel`` (see :class:`agent_gateway.Route`).

Their models validate the requests and are what ``/openapi.json`` says of them. A refused
request names the field as OpenAI does (``input[0].content``, in ``param``); the fields the
gateway does not read are allowed and ignored (sampling parameters, ``store``, ``include``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from agent_gateway import Route, RouteResponse, refuse

MAX_TOOLS = 128
MAX_SEQUENCE = 999_999_999_999_999_999  # 18 digits: a sequence number a resume may name
VISIBLE_PATTERN = r"[^\s\u001c-\u001f\u0085\ufeff]"
TAG_MARK = "<"  # a union member's tag in an error's location starts so (never a field name)


# -- the refusals, as OpenAI writes them ---------------------------------------------------------------


def openai_param(location: tuple[int | str, ...]) -> str:
    """An error's location as OpenAI names a field: ``input[0].content`` (union tags left out)."""
    param = ""
    for part in location:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not part.startswith(TAG_MARK):
            param += f".{part}" if param else part
    return param


def _phrase(error: Mapping[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    phrases = {
        "missing": "is required",
        "string_type": "must be a string",
        "string_too_short": "must be a non-empty string",
        "string_too_long": f"must be at most {ctx.get('max_length')} characters",
        "bool_type": "must be a boolean",
        "list_type": "must be a list",
        "too_short": f"must hold at least {ctx.get('min_length')} item(s)",
        "too_long": f"must hold at most {ctx.get('max_length')} item(s)",
        "dict_type": "must be an object",
        "model_type": "must be an object",
        "model_attributes_type": "must be an object",
        "literal_error": f"must be {ctx.get('expected')}",
    }
    phrase = phrases.get(kind)
    if phrase is not None:
        return phrase
    message = str(error["msg"])  # a custom error's message is already a phrase
    return message[:1].lower() + message[1:]


class OpenAIRequest(BaseModel):
    """A request model whose refusal is one ``400 invalid_request`` naming the first bad field in
    OpenAI's form (``param``). ``refusal_messages``: the whole message of a refusal at a field (by its
    ``param``), where the gateway's message says more than the generic one."""

    refusal_messages: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="wrap")
    @classmethod
    def _openai_refusal(cls, data: Any, handler: Any) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            raise cls.refusal(exc.errors(include_url=False)[0]) from None

    @classmethod
    def refusal(cls, error: Mapping[str, Any]) -> PydanticCustomError:
        if error["type"] == "api_refusal":  # a validator's own (agent_gateway.refuse): kept whole
            ctx = error["ctx"]
            return refuse(ctx["code"], ctx["message"], **ctx["extra"])
        param = openai_param(error["loc"])
        if not param:
            return refuse("invalid_request", "the body must be a JSON object", param=None)
        message = cls.refusal_messages.get(param) or f"{param} {_phrase(error)}"
        return refuse("invalid_request", message, param=param)


def _kind_of(value: Any, kinds: Mapping[type, str]) -> str | None:
    for python_type, tag in kinds.items():
        if isinstance(value, python_type):
            return tag
    return None


def _text_or_parts(value: Any) -> str | None:
    return _kind_of(value, {str: "<text>", list: "<parts>"})


def _string_or_items(value: Any) -> str | None:
    return _kind_of(value, {str: "<text>", list: "<items>"})


# -- the request body ----------------------------------------------------------------------------------

ToolName = Annotated[str, Field(min_length=1, max_length=200)]


class ResponseContentPart(BaseModel):
    """A part of a message's content: its text parts (`input_text`, `output_text`, `text`) count;
    the others (images, files, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: str
    text: str | None = None


MessageContent = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[ResponseContentPart], Tag("<parts>")],
    Discriminator(
        _text_or_parts,
        custom_error_type="content_kind",
        custom_error_message="must be a string or a list of content parts",
    ),
]


class ResponseInputMessage(BaseModel):
    """A message item: the last one with role `user` is the run's message; the ones before it are
    the conversation the gateway matches against its sessions."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["message"] = "message"
    role: str
    content: MessageContent | None = None

    def text(self, part_types: frozenset[str]) -> str:
        """The content's text: the string, or its text parts of ``part_types``, a line each."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content if part.type in part_types and part.text is not None)


class ResponseFunctionCall(BaseModel):
    """A call of a client tool the model made (resent by the client before its result)."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: ToolName
    arguments: str = ""


class ResponseFunctionCallOutput(BaseModel):
    """The result of a client tool call."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Any = Field(None, description="The result: text, or a list of content parts")


class ResponseItemReference(BaseModel):
    """An earlier item by id: one of the gateway's answers (`msg_<hostRunId>`) stands for that
    message; others are ignored."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["item_reference"]
    id: str


KNOWN_ITEMS = ("message", "function_call", "function_call_output", "item_reference")


def _not_known(schema: dict[str, Any]) -> None:
    schema["properties"]["type"]["not"] = {"enum": list(KNOWN_ITEMS)}


class ResponseOtherItem(BaseModel):
    """Any other item (reasoning, hosted tool calls, ...): accepted and ignored."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True, json_schema_extra=_not_known)
    type: str


def _item_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message")
    return f"<{kind}>" if kind in KNOWN_ITEMS else "<other>"


InputItem = Annotated[
    Annotated[ResponseInputMessage, Tag("<message>")]
    | Annotated[ResponseFunctionCall, Tag("<function_call>")]
    | Annotated[ResponseFunctionCallOutput, Tag("<function_call_output>")]
    | Annotated[ResponseItemReference, Tag("<item_reference>")]
    | Annotated[ResponseOtherItem, Tag("<other>")],
    Discriminator(_item_kind, custom_error_type="item_kind", custom_error_message="must be an object"),
]
ResponseInput = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[InputItem], Field(min_length=1), Tag("<items>")],
    Discriminator(_string_or_items, custom_error_type="input_kind", custom_error_message="must be a string or a list"),
]


class ResponseFunctionTool(BaseModel):
    """A client tool (a function); only these are served here."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseToolChoiceFunction(BaseModel):
    """A tool the model must call."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["function"]
    name: ToolName


def _choice_kind(value: Any) -> str | None:
    return _kind_of(value, {str: "<mode>", dict: "<function>"})


ToolChoice = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("<mode>")]
    | Annotated[ResponseToolChoiceFunction, Tag("<function>")],
    Discriminator(_choice_kind, custom_error_type="choice_kind", custom_error_message="must be a mode or a function"),
]


class ResponseTextFormat(BaseModel):
    """The answer's format: `json_schema` and `json_object` become the run's `responseFormat`."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseTextConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    format: ResponseTextFormat | None = None


class ResponseCreateRequest(OpenAIRequest):
    """A `POST /v1/responses` body."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    refusal_messages: ClassVar[Mapping[str, str]] = {
        "model": "model must be an agent id (see GET /v1/models)",
        "input": "input must be a string or a non-empty list of input items",
        "tools": f"tools must be a list of at most {MAX_TOOLS} tools",
        "tool_choice": "tool_choice must be 'auto', 'none', 'required' or a function",
        "text.format.type": "text.format.type must be 'text', 'json_object' or 'json_schema'",
        "metadata": "metadata must be an object of strings",
    }

    model: str = Field(min_length=1, description="An agent id (GET /v1/models)")
    input: ResponseInput = Field(
        description="The question: a string, or items whose last `user` message is the run's message (the "
        "messages before it are the conversation; function calls and their outputs after it, the client tools' "
        "exchange)."
    )
    instructions: str | None = Field(None, description="Accepted and not sent to the agent.")
    tools: list[ResponseFunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: ResponseTextConfig | None = None
    stream: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    user: str | None = Field(None, max_length=200)
    metadata: dict[str, str] | None = Field(
        None,
        description="Strings. `session_id` names the gateway session (the agent's live session is kept across "
        "requests), `workspace_id` the workspace (default `default`), `allowed_roots` the workspace folders its "
        "tools may touch, comma-separated (`.`: all; without it, none).",
    )

    @classmethod
    def refusal(cls, error: Mapping[str, Any]) -> PydanticCustomError:
        location = error["loc"]
        # Only function tools are served: another kind is not a malformed request.
        if len(location) == 3 and location[0] == "tools" and location[2] == "type":
            if error["type"] in ("literal_error", "missing"):
                param = f"tools[{location[1]}]"
                kind = str(error["input"].get("type") if error["type"] == "missing" else error["input"])[:40]
                message = f"{param}: only function tools are served here, not {kind!r}"
                return refuse("tools_not_supported", message, param=param)
        if location and location[0] == "metadata":  # (a value's error names the field)
            error = {**error, "loc": ("metadata",)}
        return super().refusal(error)

    @property
    def items(self) -> list[Any]:
        """The input items (none for a string input)."""
        return [] if isinstance(self.input, str) else self.input


# -- the GET's path and query --------------------------------------------------------------------------


class ResponsePath(BaseModel):
    response_id: str = Field(min_length=1, description="A response of the caller (`resp_<hostRunId>`).")


def _true_or_false(value: Any) -> Any:
    if value == "true":
        return True
    if value == "false":
        return False
    return value  # (refused as a boolean)


def _sequence_number(value: Any) -> Any:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= len(str(MAX_SEQUENCE)):
        return int(value)
    return value  # (refused as an integer)


class ResponseQuery(OpenAIRequest):
    """The query of `GET /v1/responses/{response_id}`; other parameters are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)
    refusal_messages: ClassVar[Mapping[str, str]] = {
        "stream": "stream must be true or false",
        "starting_after": "starting_after must be a sequence number (0 or more)",
    }

    stream: Annotated[bool, BeforeValidator(_true_or_false)] = Field(
        False, description="Stream the response's events (SSE) instead of the object."
    )
    starting_after: Annotated[int, Field(ge=0, le=MAX_SEQUENCE), BeforeValidator(_sequence_number)] | None = Field(
        None,
        description="With `stream`: only events with a larger `sequence_number` (works for every response, not "
        "only background ones).",
    )


# -- the answers ---------------------------------------------------------------------------------------


class ResponseUsage(BaseModel):
    """Token counts the agent's runtime reported for the run."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class ResponseObject(BaseModel):
    """The `response` object."""

    # Documentation only: mapping.ResponseStream builds the answers.

    model_config = ConfigDict(extra="allow", defer_build=True)
    id: str
    object: Literal["response"]
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled", "incomplete"]
    model: str
    output: list[dict[str, Any]]
    usage: ResponseUsage | None = Field(
        None, description="Token counts the agent's runtime reported for the run (null when it reported none)"
    )


class OpenAIErrorDetail(BaseModel):
    model_config = ConfigDict(defer_build=True)
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(BaseModel):
    """An OpenAI error body."""

    model_config = ConfigDict(defer_build=True)
    error: OpenAIErrorDetail


STREAMED_EVENTS = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"type": "string", "minLength": 1},
                "data": {"type": "string", "contentMediaType": "application/json"},
            },
            "description": "`event: <type>` + `data: <Responses stream event JSON with a dense sequence_number>`; "
            "`: ping` comments are heartbeats.",
        }
    }
}


COMMON_ERRORS = {
    401: "Tokens are configured and the request has no `Authorization: Bearer <token>` or an unknown one (OpenAI "
    "error body).",
    403: "Refused by the browser guard: a non-loopback Host or a disallowed origin (OpenAI error body).",
    503: "The gateway's database is unreachable, or the gateway is stopping (OpenAI error body).",
}


def _errors(described: Mapping[int, str]) -> dict[int | str, RouteResponse]:
    """The OpenAI error answers by status: ``described``, and the ones every route has."""
    return {status: RouteResponse(text, OpenAIError) for status, text in {**COMMON_ERRORS, **described}.items()}


TAG = "openai-compatible (plugin)"
MULTITASK_STRATEGIES = ["enqueue", "reject", "interrupt", "rollback"]
ID_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": VISIBLE_PATTERN}
CREATE_HEADERS: tuple[dict[str, Any], ...] = (
    {
        "name": "X-Agent-Gateway-Session",
        "in": "header",
        "schema": ID_SCHEMA,
        "description": "The gateway session of this request; wins over `metadata.session_id`, "
        "`previous_response_id` and `user`.",
    },
    {
        "name": "X-Agent-Gateway-Multitask",
        "in": "header",
        "schema": {"type": "string", "enum": MULTITASK_STRATEGIES},
        "description": "What this request does while a run of its session is still active (wins over "
        "`metadata.multitask_strategy`): `enqueue` waits behind it, `reject` answers 409 `session_busy`, "
        "`interrupt` cancels it (the agent still knows the cut-off turn), `rollback` cancels it and the agent "
        "forgets it (400 `rollback_not_supported` for an agent that keeps its own session). Default: the "
        "gateway's `multitask_strategy` configuration.",
    },
    {
        "name": "Idempotency-Key",
        "in": "header",
        "schema": ID_SCHEMA,
        "description": "The run's requestId: a repeat with the same key (same session and body) returns the same run.",
    },
)
BAD_REQUEST = (
    "The request is malformed (OpenAI error body; `param` names the field): bad JSON, JSON nested deeper than "
    "64 levels, text with a NUL or a lone surrogate, a field of the wrong type, no user message."
)
NO_RESPONSE = "No response with that id for the caller (`code` `response_not_found`)."

CREATE_ERRORS = {
    400: BAD_REQUEST,
    404: "No agent with that id (`model_not_found`), or no such `previous_response_id` (`response_not_found`).",
    409: "The `Idempotency-Key` was used before with a different request (`request_conflict`), or the session "
    "still answers and the request's multitask strategy is `reject` (`session_busy`).",
    413: "The body exceeds `[gateway] max_body_bytes` (OpenAI error body).",
    415: "The body is not `application/json` (OpenAI error body).",
    429: "Run admission refused: the session's queue or the caller's active runs are full; retry after "
    "`Retry-After` seconds (OpenAI error body).",
    503: "The gateway's database is unreachable, or the gateway is stopping (OpenAI error body). Or the agent cannot "
    "run here (`code` `agent_unavailable`, `param` `model`; the message says what to install or set), with "
    "`x-should-retry: false`.",
}

CREATE_RESPONSE: Route[ResponseCreateRequest, Any] = Route(
    "POST",
    "/v1/responses",
    "OpenAI-compatible response: runs the agent named by `model` on the last user input (openai_compat plugin)",
    operation_id="openaiCreateResponse",
    description="`background: true` answers at once (status `queued` or `in_progress`); `stream: true` streams "
    "the events; otherwise the answer comes when the run ends. The session is the `X-Agent-Gateway-Session` "
    "header, else `metadata.session_id`, else the session of `previous_response_id`, else `user`, else a new "
    "one. Function `tools`, `tool_choice`, `parallel_tool_calls`, `text.format` and the `function_call` / "
    "`function_call_output` items after the last user message go to an agent whose policy has `clientTools` "
    "(chat-only; the model's calls come back as `function_call` items); for another agent they are a 400 "
    '`tools_not_supported` (or, with `[openai_compat] client_tools = "ignore"`, left out and named in '
    "`X-Agent-Gateway-Ignored`).",
    tags=(TAG,),
    body=ResponseCreateRequest,
    headers=CREATE_HEADERS,
    responses={
        200: RouteResponse(
            "The `response` object (JSON), or with `stream: true` its events (SSE)", ResponseObject, STREAMED_EVENTS
        ),
        **_errors(CREATE_ERRORS),
    },
)
GET_RESPONSE: Route[Any, ResponseQuery, ResponsePath] = Route(
    "GET",
    "/v1/responses/{response_id}",
    "OpenAI-compatible: a response, or its events resumed after `starting_after` (openai_compat plugin)",
    operation_id="openaiGetResponse",
    tags=(TAG,),
    params=ResponsePath,
    query=ResponseQuery,
    responses={
        200: RouteResponse("The `response` object, or its events (SSE)", ResponseObject, STREAMED_EVENTS),
        **_errors({400: BAD_REQUEST, 404: NO_RESPONSE}),
    },
)
CANCEL_RESPONSE: Route[Any, Any, ResponsePath] = Route(
    "POST",
    "/v1/responses/{response_id}/cancel",
    "OpenAI-compatible: cancel a response (its run) and return it once ended (openai_compat plugin)",
    operation_id="openaiCancelResponse",
    tags=(TAG,),
    params=ResponsePath,
    responses={
        200: RouteResponse(
            "The `response` object after the cancel (status `cancelled`, or the status it had already ended with)",
            ResponseObject,
        ),
        **_errors({404: NO_RESPONSE}),
    },
)
