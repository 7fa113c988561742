"""``/v1/models``, ``/v1/models/{model}`` and ``/v1/chat/completions``, declared once
(:class:`agent_gateway.Route`): the request and response models ``/openapi.json`` lists and the
handlers validate with.

Requests allow fields the gateway does not read (``temperature``, ``n``, a content part's
``image_url``, ...): OpenAI clients send them and the gateway ignores them. Models are strict
(``"true"`` is not a boolean). A refusal names its field as OpenAI does, ``messages[0].content``
(:func:`agent_gateway.declare.json_path`), and keeps the messages the routes had before they were
declared. The response models document what the handlers build (as dicts, on the hot path).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from agent_gateway import VISIBLE, Route, RouteResponse, json_path, refuse

from .common import (
    ADMISSION,
    AFFINITY_HEADER,
    AGENT_UNAVAILABLE,
    BAD_REQUEST,
    COMMON_ERRORS,
    CONFLICT,
    IGNORED_HEADER,
    MAX_ID_LENGTH,
    MAX_TOOLS,
    NOT_JSON,
    RUN_HEADERS,
    SESSION_HEADER,
    TAG,
    TOO_LARGE,
    AgentId,
    Metadata,
    OpenAIErrorDetail,
    error_answer,
    format_type,
    openai_error,
    tool_choice_kind,
    tool_list,
    wrong,
)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
MAX_TOOL_NAME = 200
# Requests: strict, and fields the gateway ignores allowed (OpenAI clients send many).
REQUEST = ConfigDict(extra="allow", strict=True, defer_build=True)
RESPONSE = ConfigDict(defer_build=True)


# -- request: /v1/chat/completions -----------------------------------------------------------------
class ChatContentPart(BaseModel):
    """A part of a message's content; only `text` parts count as its text (an image is ignored)."""

    model_config = REQUEST
    type: str
    text: str = Field("", description="the part's text (a `text` part)")

    @model_validator(mode="before")
    @classmethod
    def _a_part(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):
            raise wrong("content_part", "must be a content part with a type")
        return value


def _content_kind(value: Any) -> str | None:
    return "<text>" if isinstance(value, str) else "<parts>" if isinstance(value, list) else None


# A message's content: text, or a list of content parts (null: none).
ChatContent = Annotated[
    Annotated[str, Tag("<text>")] | Annotated[list[ChatContentPart], Tag("<parts>")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="must be a string or a list of content parts",
    ),
]


def _tool_name(value: Any) -> Any:
    if not isinstance(value, str) or not value or len(value) > MAX_TOOL_NAME:
        raise wrong("tool_name", f"must be a tool name (1 to {MAX_TOOL_NAME} characters)")
    return value


ToolName = Annotated[str, Field(min_length=1, max_length=MAX_TOOL_NAME), BeforeValidator(_tool_name)]


class ChatFunctionCall(BaseModel):
    model_config = REQUEST
    name: ToolName
    arguments: str = Field("", description="the arguments, as JSON text")


class ChatToolCall(BaseModel):
    """A call of a client tool (the assistant's `tool_calls`)."""

    model_config = REQUEST
    id: str
    type: Literal["function"] = "function"
    function: ChatFunctionCall


class _Message(BaseModel):
    model_config = REQUEST
    content: ChatContent | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text: its content, or its text parts one a line."""
        content = self.content
        if content is None or isinstance(content, str):
            return content or ""
        return "\n".join(part.text for part in content if part.type == "text" and "text" in part.model_fields_set)


class ChatSystemMessage(_Message):
    role: Literal["system"]


class ChatDeveloperMessage(_Message):
    role: Literal["developer"]


class ChatUserMessage(_Message):
    role: Literal["user"]


class ChatAssistantMessage(_Message):
    role: Literal["assistant"]
    refusal: str | None = None
    tool_calls: list[ChatToolCall] | None = Field(
        None, description="the client tools the model called (after the last user message: passed to the agent)"
    )


class ChatToolMessage(_Message):
    role: Literal["tool"]
    tool_call_id: Annotated[str, Field(min_length=1)]

    @field_validator("tool_call_id", mode="before")
    @classmethod
    def _a_call_id(cls, value: Any) -> Any:
        if not isinstance(value, str) or not value:
            raise wrong("tool_call_id", "must be a string")
        return value


class ChatFunctionMessage(_Message):
    role: Literal["function"]


def _role_tag(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, dict) else None
    return f"<{role}>" if role in CHAT_ROLES else None


ChatMessage = Annotated[
    Annotated[ChatSystemMessage, Tag("<system>")]
    | Annotated[ChatDeveloperMessage, Tag("<developer>")]
    | Annotated[ChatUserMessage, Tag("<user>")]
    | Annotated[ChatAssistantMessage, Tag("<assistant>")]
    | Annotated[ChatToolMessage, Tag("<tool>")]
    | Annotated[ChatFunctionMessage, Tag("<function>")],
    Discriminator(_role_tag, custom_error_type="message_role", custom_error_message="must be an object with a role"),
]


class ChatFunction(BaseModel):
    model_config = REQUEST
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="the arguments' JSON Schema")
    strict: bool | None = None


class ChatTool(BaseModel):
    """A client tool the model may call (passed to an agent whose policy has `clientTools`)."""

    model_config = REQUEST
    type: Literal["function"] = "function"
    function: ChatFunction


ToolChoice = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("<mode>")]
    | Annotated[dict[str, Any], Tag("<object>"), Field(description="a function or allowed tools: the upstream's")],
    Discriminator(
        tool_choice_kind,
        custom_error_type="tool_choice",
        custom_error_message="must be 'auto', 'none', 'required' or an object",
    ),
]


class ChatResponseFormat(BaseModel):
    """Structured output (`json_object`, `json_schema`: passed to an agent whose policy has `clientTools`)."""

    model_config = REQUEST
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _a_format(cls, value: Any) -> Any:
        return format_type(value, "response_format", "response_format")


class ChatStreamOptions(BaseModel):
    model_config = REQUEST
    include_usage: bool = Field(False, description="a last chunk with the run's token counts (`usage`)")


def _messages(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A non-empty list of messages; one without a known role is refused at its role, as OpenAI
    does (looked for only in a refusal: a long conversation is not walked twice)."""
    if not isinstance(value, list) or not value:
        raise wrong("messages", "must be a non-empty list")
    try:
        return handler(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        if first["type"] == "message_role":
            index = first["loc"][0]
            raise refuse(
                "invalid_request", f"messages[{index}] must be an object with a role", param=f"messages[{index}].role"
            ) from None
        raise


class ChatCompletionRequest(BaseModel):
    """A chat completion: the agent `model` runs on the last user message."""

    model_config = REQUEST
    model: AgentId
    messages: Annotated[
        list[ChatMessage],
        Field(
            min_length=1,
            description="The conversation; the last user message is the run's. Earlier ones are not sent to the "
            "agent (the gateway session is its memory): they choose the session when the request names none.",
            json_schema_extra={"contains": {"type": "object", "properties": {"role": {"const": "user"}}}},
        ),
        WrapValidator(_messages),
    ]
    stream: bool | None = None
    stream_options: ChatStreamOptions | None = None
    user: Annotated[str, Field(max_length=MAX_ID_LENGTH)] | None = Field(
        None, description="The session, when neither the header nor `metadata.session_id` names one"
    )
    metadata: Metadata = None
    tools: Annotated[Annotated[list[ChatTool], Field(max_length=MAX_TOOLS)] | None, BeforeValidator(tool_list)] = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ChatResponseFormat | None = None

    _last_user: int = PrivateAttr(-1)

    @model_validator(mode="after")
    def _a_user_message_with_text(self) -> ChatCompletionRequest:
        messages = self.messages
        last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), -1)
        if last < 0:  # (a refusal of the whole model would name no field: named here)
            raise refuse("invalid_request", "messages must hold a user message", param="messages")
        if not VISIBLE.search(self.messages[last].text()):
            raise refuse(
                "invalid_request", "the last user message must hold some text", param=f"messages[{last}].content"
            )
        self._last_user = last
        return self

    @property
    def last_user(self) -> int:
        """The index of the last user message (the run's message)."""
        return self._last_user

    @property
    def message(self) -> str:
        """The run's message: the last user message's text."""
        return self.messages[self._last_user].text()


# -- responses ---------------------------------------------------------------------------------------
class OpenAIModel(BaseModel):
    """An agent, as a model."""

    model_config = RESPONSE
    id: str = Field(description="the agent id")
    object: Literal["model"]
    created: int
    owned_by: str


class OpenAIModelList(BaseModel):
    model_config = RESPONSE
    object: Literal["list"]
    data: list[OpenAIModel]


class ModelPath(BaseModel):
    model_config = ConfigDict(strict=True, defer_build=True)
    model: Annotated[str, Field(min_length=1)]


class ChatToolSummary(BaseModel):
    """A tool the agent used: never its arguments, results or paths."""

    model_config = RESPONSE
    id: str
    name: str
    status: str
    kind: str | None = None


class ChatGatewayExtension(BaseModel):
    """The run behind the answer (not an OpenAI field)."""

    model_config = RESPONSE
    hostRunId: str
    sessionId: str
    sessionMode: str | None
    status: str | None
    tools: list[ChatToolSummary]
    ignored: list[str] | None = Field(None, description="request fields the run left out (`client_tools = ignore`)")


class ChatUsage(BaseModel):
    """Token counts the agent's runtime reported for the run."""

    model_config = RESPONSE
    prompt_tokens: Annotated[int, Field(ge=0)]
    completion_tokens: Annotated[int, Field(ge=0)]
    total_tokens: Annotated[int, Field(ge=0)]
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None


class ChatCompletionMessage(BaseModel):
    model_config = RESPONSE
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: str | None = Field(None, description="the agent's thoughts (`reasoning = reasoning_content`)")


class ChatCompletionChoice(BaseModel):
    model_config = RESPONSE
    index: int
    message: ChatCompletionMessage
    finish_reason: Literal["stop", "tool_calls"]
    logprobs: None


class ChatCompletionResponse(BaseModel):
    """A `chat.completion`."""

    model_config = RESPONSE
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: ChatUsage | None = Field(description="null when the runtime reported no token counts")
    agent_gateway: ChatGatewayExtension


class ChatToolCallDelta(ChatToolCall):
    index: int


class ChatChunkDelta(BaseModel):
    model_config = RESPONSE
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ChatToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    model_config = RESPONSE
    index: int
    delta: ChatChunkDelta
    finish_reason: Literal["stop", "tool_calls"] | None


class ChatCompletionChunk(BaseModel):
    """A `chat.completion.chunk`; `agent_gateway` is a tool's summary (`{"tool": ...}`) or, on the
    last chunk, the run."""

    model_config = RESPONSE
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: ChatUsage | None = None
    agent_gateway: dict[str, Any] | None = None


class ChatCompletionStreamError(BaseModel):
    """The last chunk of a failed or interrupted run (then `[DONE]`)."""

    model_config = RESPONSE
    error: OpenAIErrorDetail
    agent_gateway: ChatGatewayExtension


class ChatCompletionEvent(BaseModel):
    """One SSE frame of a streamed chat completion: `data: <chunk JSON>`, the last one
    `data: [DONE]`; `: ping` comments are heartbeats."""

    model_config = RESPONSE
    data: ChatCompletionChunk | ChatCompletionStreamError

    @staticmethod
    def adjust_openapi_schema(schema: dict[str, Any]) -> None:
        # Sent as JSON text (or `[DONE]`): the chunk is the text's schema, not the field's.
        chunk = schema["properties"]["data"]
        schema["properties"]["data"] = {
            "anyOf": [
                {"type": "string", "contentMediaType": "application/json", "contentSchema": chunk},
                {"const": "[DONE]", "description": "after the last chunk"},
            ]
        }


# -- the routes ----------------------------------------------------------------------------------------
ANSWER_HEADERS = {
    SESSION_HEADER: {"schema": {"type": "string"}, "description": "The session the run went to"},
    AFFINITY_HEADER: {
        "schema": {"type": "string"},
        "description": "How the session was chosen: `pinned`, `continued`, `new` or `fresh` (docs/sessions.md)",
    },
    IGNORED_HEADER: {
        "schema": {"type": "string"},
        "description": 'The request fields the run left out (`[openai_compat] client_tools = "ignore"`)',
    },
}


MODEL_ERRORS: dict[int | str, RouteResponse] = {
    404: error_answer("No agent with that id (`code` `model_not_found`)."),
    503: error_answer(AGENT_UNAVAILABLE),
}


LIST_MODELS: Route[Any, Any] = Route(
    "GET",
    "/v1/models",
    "OpenAI-compatible: the agents, as models (openai_compat plugin)",
    operation_id="openaiListModels",
    tags=(TAG,),
    responses={
        200: RouteResponse(
            "Every agent that can run here, as a model (an agent whose `/v1/agents` availability is false is left out)",
            OpenAIModelList,
        ),
        **COMMON_ERRORS,
    },
    error_shape=openai_error,
    field_path=json_path,
)
GET_MODEL: Route[Any, Any, ModelPath] = Route(
    "GET",
    "/v1/models/{model}",
    "OpenAI-compatible: one agent, as a model (openai_compat plugin)",
    operation_id="openaiGetModel",
    tags=(TAG,),
    params=ModelPath,
    responses={200: RouteResponse("The agent", OpenAIModel), **COMMON_ERRORS, **MODEL_ERRORS},
    error_shape=openai_error,
    field_path=json_path,
)
CHAT_COMPLETIONS: Route[ChatCompletionRequest, Any] = Route(
    "POST",
    "/v1/chat/completions",
    "OpenAI-compatible chat completion: runs the agent named by `model` on the last user message "
    "(openai_compat plugin)",
    operation_id="openaiChatCompletions",
    tags=(TAG,),
    description="The session is the `X-Agent-Gateway-Session` header, else `metadata.session_id`, else `user`, "
    "else the session whose last turn the earlier messages end with, else a new one given them "
    "(docs/sessions.md). Earlier messages are not sent to the agent: the gateway session is the conversation's "
    "memory. `tools`, `tool_choice`, `parallel_tool_calls`, `response_format` and the tool calls and results "
    "after the last user message go to an agent whose policy has `clientTools` (chat-only); for another agent "
    'they are a 400 `tools_not_supported` (or, with `[openai_compat] client_tools = "ignore"`, left out and '
    "named in `X-Agent-Gateway-Ignored`). Other OpenAI fields are accepted and ignored.",
    body=ChatCompletionRequest,
    headers=RUN_HEADERS,
    responses={
        200: RouteResponse(
            "A `chat.completion` (JSON), or with `stream: true` its chunks (SSE)",
            ChatCompletionResponse,
            content={"text/event-stream": ChatCompletionEvent},
            headers=ANSWER_HEADERS,
        ),
        400: error_answer(
            BAD_REQUEST + "; or client tools for an agent that cannot take them (`tools_not_supported`, "
            "`response_format_not_supported`)."
        ),
        409: error_answer(CONFLICT),
        413: error_answer(TOO_LARGE),
        415: error_answer(NOT_JSON),
        429: error_answer(ADMISSION),
        502: error_answer("The agent run failed or was interrupted (not retried by the SDK: `x-should-retry: false`)."),
        **COMMON_ERRORS,
        **MODEL_ERRORS,
    },
    error_shape=openai_error,
    field_path=json_path,
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (LIST_MODELS, GET_MODEL, CHAT_COMPLETIONS)
