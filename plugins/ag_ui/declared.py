"""The AG-UI routes, declared once (:class:`agent_gateway.Route`): ``RunAgentInput`` as the gateway
accepts it, the resumed stream's path, query and ``Last-Event-ID``, and the event stream answered.

The models follow the AG-UI SDK's (PyPI ``ag-ui-protocol``): camelCase wire names, unknown fields
kept, pydantic's usual coercion, messages told apart by ``role`` and content parts by ``type``.
They are the gateway's own so that validating a request needs no SDK import (its 84 event models
are built when a stream is first encoded) and so that ``/openapi.json`` says what is checked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, model_validator

from agent_gateway import VISIBLE, Identifier, Route, RouteResponse, refuse

MULTITASK_STRATEGIES = ("enqueue", "reject", "interrupt", "rollback")
TAGS = ("AG-UI (ag_ui plugin)",)
# Requests: as the SDK takes them (unknown fields kept, not refused).
REQUEST = ConfigDict(extra="allow", defer_build=True)
MEDIA_PARTS = ("image", "audio", "video", "document", "binary")
MESSAGE_ROLES = ("user", "system", "developer", "assistant", "tool", "activity", "reasoning")
# The keys of `forwardedProps.agentGateway` that go into the gateway run as they are.
GATEWAY_PROPS = ("workspaceId", "context", "options", "parentRunId", "multitaskStrategy")
NO_USER_TEXT = "RunAgentInput.messages holds no user message with text"


def field_name(location: Any) -> str:
    """``messages.0.content``: the gateway's dotted form, without the tags of the unions' members."""
    return ".".join(str(p) for p in location if not (isinstance(p, str) and p.startswith("<") and p.endswith(">")))


# -- content parts -------------------------------------------------------------------------------------
class AgUiTextPart(BaseModel):
    model_config = REQUEST
    type: Literal["text"]
    text: str


class AgUiMediaPart(BaseModel):
    """An image, audio, video or document part (its `source`): not read by the gateway."""

    model_config = REQUEST
    type: Literal["image", "audio", "video", "document", "binary"]


def _part_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    return "<text>" if kind == "text" else "<media>" if kind in MEDIA_PARTS else None


AgUiContentPart = Annotated[
    Annotated[AgUiTextPart, Tag("<text>")] | Annotated[AgUiMediaPart, Tag("<media>")],
    Discriminator(
        _part_kind,
        custom_error_type="content_part",
        custom_error_message="must be a content part (type text, image, audio, video or document)",
    ),
]


def _content_kind(value: Any) -> str | None:
    return "<text>" if isinstance(value, str) else "<parts>" if isinstance(value, list) else None


# Text, or a list of content parts.
AgUiContent = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[AgUiContentPart], Tag("<parts>")],
    Discriminator(
        _content_kind, custom_error_type="content_type", custom_error_message="must be a string or a list of parts"
    ),
]


def text_of(content: Any) -> str:
    """A content's text: the text itself, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.text for part in content if isinstance(part, AgUiTextPart))
    return ""


# -- messages ------------------------------------------------------------------------------------------
class AgUiFunctionCall(BaseModel):
    model_config = REQUEST
    name: str
    arguments: str = Field(description="the arguments, as JSON text")


class AgUiToolCall(BaseModel):
    model_config = REQUEST
    id: str
    type: Literal["function"] = "function"
    function: AgUiFunctionCall


class AgUiUserMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["user"]
    content: AgUiContent


class AgUiSystemMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["system"]
    content: str


class AgUiDeveloperMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["developer"]
    content: str


class AgUiAssistantMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["assistant"]
    content: str | None = None
    toolCalls: list[AgUiToolCall] | None = None


class AgUiToolMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["tool"]
    content: AgUiContent
    toolCallId: str


class AgUiActivityMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["activity"]
    activityType: str
    content: dict[str, Any]


class AgUiReasoningMessage(BaseModel):
    model_config = REQUEST
    id: str
    role: Literal["reasoning"]
    content: str


def _role_tag(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, dict) else None
    return f"<{role}>" if role in MESSAGE_ROLES else None


AgUiMessage = Annotated[
    Annotated[AgUiUserMessage, Tag("<user>")]
    | Annotated[AgUiSystemMessage, Tag("<system>")]
    | Annotated[AgUiDeveloperMessage, Tag("<developer>")]
    | Annotated[AgUiAssistantMessage, Tag("<assistant>")]
    | Annotated[AgUiToolMessage, Tag("<tool>")]
    | Annotated[AgUiActivityMessage, Tag("<activity>")]
    | Annotated[AgUiReasoningMessage, Tag("<reasoning>")],
    Discriminator(
        _role_tag,
        custom_error_type="message_role",
        custom_error_message=f"must be a message with a role ({', '.join(MESSAGE_ROLES)})",
    ),
]

# What the document says of "a user message with visible text" (the validator below checks it).
_VISIBLE_TEXT = {"type": "string", "pattern": VISIBLE.pattern}
HAS_USER_TEXT: dict[str, Any] = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"const": "user"},
        "content": {
            "anyOf": [
                _VISIBLE_TEXT,
                {
                    "type": "array",
                    "contains": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {"type": {"const": "text"}, "text": _VISIBLE_TEXT},
                    },
                },
            ]
        },
    },
}


# -- the rest of the input -----------------------------------------------------------------------------
class AgUiTool(BaseModel):
    """A frontend tool (the client runs it): for an agent that takes client tools."""

    model_config = REQUEST
    name: str
    description: str
    parameters: Any = Field(None, description="the arguments' JSON Schema")


class AgUiContext(BaseModel):
    model_config = REQUEST
    description: str
    value: str


class AgUiGatewayProps(BaseModel):
    """Fields of the gateway run (as `POST /v1/runs` takes them; other keys are ignored)."""

    model_config = REQUEST
    # (no null: the core takes a workspace id or none, default `default`)
    workspaceId: Identifier = Field(None, description="the run's workspace (default `default`)")  # type: ignore[assignment]
    context: dict[str, Any] | None = Field(
        None,
        description="the run's context (`allowedRoots`, ...)",
        json_schema_extra={"properties": {"allowedRoots": {"type": "array", "items": {"type": "string"}}}},
    )
    options: dict[str, Any] | None = None
    parentRunId: str | None = None
    multitaskStrategy: Literal["enqueue", "reject", "interrupt", "rollback"] | None = Field(
        None, description="null: not chosen (the default); the `X-Agent-Gateway-Multitask` header wins"
    )

    def run_fields(self) -> dict[str, Any]:
        """The fields given, for the run (a null multitaskStrategy is "not chosen": the default)."""
        fields = {name: getattr(self, name) for name in GATEWAY_PROPS if name in self.model_fields_set}
        if fields.get("multitaskStrategy", "") is None:
            del fields["multitaskStrategy"]
        return fields


class AgUiForwardedProps(BaseModel):
    model_config = REQUEST
    # (absent, or an object: a null is refused, as before)
    agentGateway: AgUiGatewayProps = Field(None)  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _gateway_props_object(cls, value: Any) -> Any:
        if isinstance(value, dict) and "agentGateway" in value and not isinstance(value["agentGateway"], dict):
            raise refuse("invalid_request", "forwardedProps.agentGateway must be an object")
        return value


def _props_kind(value: Any) -> str:
    return "<object>" if isinstance(value, dict) else "<any>"


ForwardedProps = Annotated[
    Annotated[AgUiForwardedProps, Tag("<object>")] | Annotated[Any, Tag("<any>")],
    Discriminator(_props_kind),
]


class AgUiRunInput(BaseModel):
    """An AG-UI `RunAgentInput`: threadId is the gateway session, runId the idempotency key
    (requestId), the last user message with text the run's message."""

    model_config = REQUEST
    threadId: Identifier
    runId: Identifier
    parentRunId: str | None = None
    state: Any = None
    messages: list[AgUiMessage] = Field(
        description="The conversation (the last user message with text is the run's; the earlier ones choose the "
        "session of a thread the caller does not have yet: docs/sessions.md, conversation affinity; for an agent "
        "that takes client tools, the assistant tool calls and tool results after the last user message are read "
        "too)",
        json_schema_extra={"contains": HAS_USER_TEXT},
    )
    tools: list[AgUiTool] | None = None
    context: list[AgUiContext] | None = None
    forwardedProps: ForwardedProps = None

    _last_user: int = PrivateAttr(-1)

    @model_validator(mode="after")
    def _a_user_message_with_text(self) -> AgUiRunInput:
        for index in range(len(self.messages) - 1, -1, -1):
            message = self.messages[index]
            if message.role == "user" and VISIBLE.search(text_of(message.content)):
                self._last_user = index
                return self
        raise refuse("invalid_request", NO_USER_TEXT)

    @property
    def message(self) -> str:
        """The run's message: the last user message with text."""
        return text_of(self.messages[self._last_user].content)

    @property
    def earlier_turns(self) -> list[tuple[str, str]]:
        """``(role, text)`` of the messages before the run's: the history conversation affinity reads."""
        return [(m.role, text_of(getattr(m, "content", None))) for m in self.messages[: self._last_user]]

    @property
    def gateway_props(self) -> AgUiGatewayProps | None:
        props = self.forwardedProps
        return props.agentGateway if isinstance(props, AgUiForwardedProps) else None

    @staticmethod
    def adjust_openapi_schema(schema: dict[str, Any]) -> None:
        # Any value; only an object is read (its `agentGateway`): "if object then ..." in the document.
        schema["properties"]["forwardedProps"] = {
            "description": "Any value; an object's `agentGateway` holds fields of the gateway run",
            "if": {"type": "object"},
            "then": {"$ref": "#/components/schemas/AgUiForwardedProps"},
        }


class AgUiRunPath(BaseModel):
    model_config = ConfigDict(defer_build=True)
    agentId: str = Field(min_length=1)

    @staticmethod
    def adjust_openapi_schema(schema: dict[str, Any]) -> None:
        schema["properties"]["agentId"] = {"$ref": "#/components/schemas/AgentId"}  # the core's enum of agents


class AgUiStreamPath(BaseModel):
    model_config = ConfigDict(defer_build=True)
    runId: str = Field(
        min_length=1,
        description="The gateway's hostRunId (RUN_STARTED metadata.agentGateway.hostRunId), or the AG-UI runId "
        "together with threadId",
    )


class AgUiStreamQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    threadId: str | None = Field(None, description="The AG-UI threadId: runId is then the AG-UI runId the client sent")
    workspaceId: str | None = Field(None, description="With threadId: the workspace of the run (default `default`)")


class AgUiFrame(BaseModel):
    """One frame of the stream: an `id` (`<seq>`, or `<seq>:<k>` before the last frame of a journal
    event's group) and the official encoder's `data` line (one AG-UI event as JSON); `: ping`
    comments are heartbeats."""

    model_config = ConfigDict(defer_build=True)
    id: str = Field(pattern=r"^[0-9]{18}(:[0-9]{1,6})?$")
    data: str = Field(json_schema_extra={"contentMediaType": "application/json"})


STREAM = RouteResponse(
    "text/event-stream of AG-UI events; the stream ends after RUN_FINISHED or RUN_ERROR",
    content={"text/event-stream": AgUiFrame},
)
LAST_EVENT_ID = {
    "name": "Last-Event-ID",
    "in": "header",
    "schema": {"type": "string", "pattern": "^([0-9]{1,18}(:[0-9]{1,6})?)?$"},
    "description": "The id of the last frame received: resume right after it",
}

RUN: Route[AgUiRunInput, Any, AgUiRunPath] = Route(
    "POST",
    "/v1/ag-ui/{agentId}",
    "Run an agent from an AG-UI RunAgentInput and stream AG-UI events",
    operation_id="agUiRun",
    description="threadId is the gateway session (a new thread whose input carries earlier messages goes to the "
    "caller's session those messages continue, or starts with them as history: RUN_STARTED "
    "metadata.agentGateway.sessionId and the X-Agent-Gateway-Session header say which), runId the idempotency key "
    "(requestId), the last user message with text the run's message. `forwardedProps.agentGateway` may carry "
    "workspaceId, context, options, parentRunId and multitaskStrategy for the gateway run; the "
    "`X-Agent-Gateway-Multitask` header (enqueue, reject, interrupt, rollback) wins over it. See docs/ag-ui.md.",
    tags=TAGS,
    body=AgUiRunInput,
    params=AgUiRunPath,
    responses={200: STREAM},
    errors=(400, 401, 403, 404, 409, 413, 415, 429, 503),
    field_path=field_name,
)
RESUME: Route[Any, AgUiStreamQuery, AgUiStreamPath] = Route(
    "GET",
    "/v1/ag-ui/runs/{runId}/stream",
    "Resume a run's AG-UI stream after Last-Event-ID (a prelude re-opens what the client had open)",
    operation_id="agUiStream",
    tags=TAGS,
    params=AgUiStreamPath,
    query=AgUiStreamQuery,
    headers=(LAST_EVENT_ID,),
    responses={200: STREAM},
    errors=(400, 401, 403, 404, 503),
)
