"""The Responses API routes declared once: ``POST /v1/responses``, ``GET /v1/responses/{response_id}``
and ``POST /v1/responses/{response_id}/cancel`` (see :class:`agent_gateway.Route`).

Their models validate the requests and are what ``/openapi.json`` says of them. A refused
request names the field as OpenAI does (``input[0].content``, in ``param``:
:func:`agent_gateway.json_path`); the fields the gateway does not read are allowed and ignored
(sampling parameters, ``store``, ``include``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from agent_gateway import Route, RouteResponse, json_path, refuse

from .common import (
    ADMISSION,
    AGENT_UNAVAILABLE,
    BAD_REQUEST,
    COMMON_ERRORS,
    CONFLICT,
    MAX_ID_LENGTH,
    MAX_TOOLS,
    NOT_JSON,
    RUN_HEADERS,
    TAG,
    TOO_LARGE,
    AgentId,
    Metadata,
    error_answer,
    format_type,
    openai_error,
    tool_choice_kind,
    tool_list,
    wrong,
)

MAX_SEQUENCE = 999_999_999_999_999_999  # 18 digits: a sequence number a resume may name


def _kind_of(value: Any, kinds: Mapping[type, str]) -> str | None:
    for python_type, tag in kinds.items():
        if isinstance(value, python_type):
            return tag
    return None


def _text_or_parts(value: Any) -> str | None:
    return _kind_of(value, {str: "<text>", list: "<parts>"})


def _string_or_items(value: Any) -> str | None:
    return "<items>" if isinstance(value, list) and value else _kind_of(value, {str: "<text>"})


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
    Discriminator(
        _string_or_items,
        custom_error_type="input_kind",
        custom_error_message="must be a string or a non-empty list of input items",
    ),
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


ToolChoice = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("<mode>")]
    | Annotated[ResponseToolChoiceFunction, Tag("<object>")],
    Discriminator(
        tool_choice_kind,
        custom_error_type="choice_kind",
        custom_error_message="must be 'auto', 'none', 'required' or a function",
    ),
]


class ResponseTextFormat(BaseModel):
    """The answer's format: `json_schema` and `json_object` become the run's `responseFormat`."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _a_format(cls, value: Any) -> Any:
        return format_type(value, "text.format", "text.format.type")


class ResponseTextConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    format: ResponseTextFormat | None = None


def _function_tools(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Only function tools are served: a tool of another kind is ``tools_not_supported``, not a
    malformed request (looked for only in a refusal)."""
    try:
        return handler(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = first["loc"]
        if len(location) == 2 and location[1] == "type" and first["type"] in ("literal_error", "missing"):
            param = f"tools[{location[0]}]"
            kind = str(first["input"].get("type") if first["type"] == "missing" else first["input"])[:40]
            message = f"{param}: only function tools are served here, not {kind!r}"
            raise refuse("tools_not_supported", message, param=param) from None
        raise


class ResponseCreateRequest(BaseModel):
    """A `POST /v1/responses` body."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)

    model: AgentId
    input: ResponseInput = Field(
        description="The question: a string, or items whose last `user` message is the run's message (the "
        "messages before it are the conversation; function calls and their outputs after it, the client tools' "
        "exchange)."
    )
    instructions: str | None = Field(None, description="Accepted and not sent to the agent.")
    tools: Annotated[
        Annotated[list[ResponseFunctionTool], Field(max_length=MAX_TOOLS)] | None,
        BeforeValidator(tool_list),
        WrapValidator(_function_tools),
    ] = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: ResponseTextConfig | None = None
    stream: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    user: str | None = Field(None, max_length=MAX_ID_LENGTH)
    metadata: Metadata = None

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
    raise wrong("true_or_false", "must be true or false")


def _sequence_number(value: Any) -> Any:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= len(str(MAX_SEQUENCE)):
        return int(value)
    raise wrong("sequence_number", "must be a sequence number (0 or more)")


class ResponseQuery(BaseModel):
    """The query of `GET /v1/responses/{response_id}`; other parameters are ignored."""

    model_config = ConfigDict(extra="ignore", strict=True, defer_build=True)

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


def _errors(described: Mapping[int, str]) -> dict[int | str, RouteResponse]:
    """The OpenAI error answers by status: ``described``, and the ones every route has."""
    return {**COMMON_ERRORS, **{status: error_answer(text) for status, text in described.items()}}


NO_RESPONSE = "No response with that id for the caller (`code` `response_not_found`)."

CREATE_ERRORS = {
    400: BAD_REQUEST + ".",
    404: "No agent with that id (`model_not_found`), or no such `previous_response_id` (`response_not_found`).",
    409: CONFLICT,
    413: TOO_LARGE,
    415: NOT_JSON,
    429: ADMISSION,
    503: AGENT_UNAVAILABLE,
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
    headers=RUN_HEADERS,
    responses={
        200: RouteResponse(
            "The `response` object (JSON), or with `stream: true` its events (SSE)", ResponseObject, STREAMED_EVENTS
        ),
        **_errors(CREATE_ERRORS),
    },
    error_shape=openai_error,
    field_path=json_path,
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
        **_errors({400: BAD_REQUEST + ".", 404: NO_RESPONSE}),
    },
    error_shape=openai_error,
    field_path=json_path,
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
    error_shape=openai_error,
    field_path=json_path,
)
