"""The core's declared request and response bodies (see :mod:`agent_gateway.declare`).

Their class names are their component names in ``/openapi.json`` (``RunRequest``, ``Run``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, RootModel
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from agent_gateway.declare import VISIBLE_PATTERN, Identifier, NonBlankText
from agent_gateway.webhooks import MAX_URL_LENGTH, url_problem
from agent_gateway.workspace_access import DEFAULT_WORKSPACE

# What a new run does to a run of its session still active ("double-texting"): queue behind it,
# be refused, cancel it (the agent keeps the cancelled turn), or cancel it and make the agent
# forget it (runtimes whose policy says `can_rollback`).
MULTITASK_STRATEGIES = ("enqueue", "reject", "interrupt", "rollback")
MultitaskStrategy = Literal["enqueue", "reject", "interrupt", "rollback"]
AGENT_ID_REF = {"$ref": "#/components/schemas/AgentId"}


def _webhook(url: str) -> str:
    problem = url_problem(url)
    if problem:
        raise PydanticCustomError("webhook_url", problem)
    return url


WebhookUrl = Annotated[
    str,
    Field(
        max_length=MAX_URL_LENGTH,
        json_schema_extra={"pattern": r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,4})?([/?#]\S*)?$"},
    ),
    AfterValidator(_webhook),
]


def no_default(schema: dict[str, Any]) -> None:
    """(``json_schema_extra``) A field whose default the document does not name."""
    schema.pop("default", None)


class RunContext(BaseModel):
    """What the host gives the agent: target, refs, allowedRoots (paths inside the workspace), host-specific keys."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)
    allowedRoots: list[str] = Field(default_factory=list)


def _run_request_schema(schema: dict[str, Any]) -> None:
    """(``RunRequest.adjust_openapi_schema``)"""
    # A client sends agentId unless its actor's ai.common.defaultAgent preference names one (the
    # model takes it absent, and the run is refused after the defaults if it is still missing):
    # the document asks for it, as the gateway's agents, so generated requests name a real one.
    schema["properties"]["agentId"] = {
        "allOf": [AGENT_ID_REF],
        "description": "The agent. A client may omit it when the actor's ai.common.defaultAgent preference is set.",
    }
    schema["required"] = ["requestId", "agentId", "sessionId", "message"]


class RunRequest(BaseModel):
    """A `POST /v1/runs` body."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    adjust_openapi_schema: ClassVar[Callable[[dict[str, Any]], None]] = staticmethod(_run_request_schema)

    requestId: Identifier = Field(
        description="Idempotency key: a repeated (actor, sessionId, workspaceId, requestId) returns the first run "
        "(200), or 409 with a different body."
    )
    agentId: Identifier | None = None
    sessionId: Identifier = Field(description="The host's conversation; runs of one session are queued one at a time.")
    workspaceId: Identifier = Field(
        DEFAULT_WORKSPACE, description="A configured workspace, or any id for runs without files."
    )
    message: NonBlankText
    context: RunContext | None = Field(
        None,
        description="What the host gives the agent: target, refs, allowedRoots (paths inside the workspace), "
        "host-specific keys.",
    )
    options: dict[str, Any] | None = Field(None, description="Runtime options (model, profile, ...).")
    parentRunId: str | None = None
    webhook: WebhookUrl | None = Field(
        None,
        description="A URL the run's receipt is POSTed to when the run ends, signed per Standard Webhooks "
        "(docs/webhooks.md). Needs [webhooks] secret (else 400 webhooks_disabled); without it, the [webhooks] "
        "default for the actor or agent applies.",
    )
    # (its default is the gateway's configured one: the document names none)
    multitaskStrategy: MultitaskStrategy = Field(
        "enqueue",
        json_schema_extra=no_default,
        description="What this run does while a run of its session is still active (double-texting): `enqueue` "
        "queues behind it (status `queued`); `reject` refuses this run with 409 `session_busy` and creates "
        "nothing; `interrupt` cancels the active run (it keeps what it streamed and ends `cancelled`, reason "
        "`interrupted by <this hostRunId>`) and this run starts when the agent is free, the agent still knowing "
        "the interrupted turn; `rollback` does the same and the agent forgets the interrupted turn, for agents "
        "whose policy has `canRollback` (others: 400 `rollback_not_supported`). Absent: the gateway's configured "
        "default for the agent (`[gateway] multitask_strategy`, `multitask_strategy_by_agent`; `enqueue` unless "
        "configured).",
    )

    def request(self) -> dict[str, Any]:
        """The run's request as stored and hashed for idempotency (its keys and values exactly
        those of the gateway's earlier hand-written validator, so a repeated requestId of a run
        created before matches): context and options ``{}`` when absent, a webhook and a
        multitaskStrategy only when sent. ``agentId`` is None when absent (the defaults fill it)."""
        sent = self.model_fields_set
        request: dict[str, Any] = {
            "requestId": self.requestId,
            "agentId": self.agentId,
            "sessionId": self.sessionId,
            "workspaceId": self.workspaceId,
            "message": self.message,
            "context": self.context.model_dump(exclude_unset=True) if self.context is not None else {},
            "options": self.options if self.options is not None else {},
            "parentRunId": self.parentRunId,
        }
        if self.webhook is not None:
            request["webhook"] = self.webhook
        if "multitaskStrategy" in sent:
            request["multitaskStrategy"] = self.multitaskStrategy
        return request


RunStatus = Literal[
    "pending", "queued", "running", "awaiting_permission", "completed", "failed", "cancelled", "interrupted"
]
SessionMode = Literal["native_live", "loaded", "cold_resumed", "new_session"]


class Run(BaseModel):
    """A run's receipt (gateway.run.v1)."""

    # Documentation only: the gateway builds receipts itself (models.Run.to_receipt).

    model_config = ConfigDict(extra="allow", defer_build=True)

    schema_: Literal["gateway.run.v1"] = Field(alias="schema")
    hostRunId: Annotated[str, Field(pattern=r"^run_[0-9a-f]{24}$")]
    requestId: str
    agentId: str
    provider: str
    providerRunId: str | None
    sessionId: str
    actorId: str
    workspaceId: str
    status: RunStatus
    sessionMode: SessionMode | None
    targetSnapshotHash: str | None
    capabilitySnapshotHash: str | None
    parentRunId: str | None
    error: str | None
    createdAt: int
    updatedAt: int
    traceId: str | None = Field(
        None, description="The run's W3C trace id (32 hex digits) when the otel plugin traces it, else null."
    )


# -- the document's shared component schemas (core_spec lists them all, referred to or not: routes,
# plugins' included, name them by reference). Documentation only: the gateway builds these
# bodies itself, so an optional field's schema names no default.


def no_defaults(schema: dict[str, Any]) -> None:
    """(a model's ``json_schema_extra``) Its fields' defaults are not in the document: a body the
    gateway writes leaves an absent field out, it does not fill it in."""
    for prop in schema.get("properties", {}).values():
        prop.pop("default", None)


# What a response body's model says of the fields it does not list, and of their defaults.
DOCUMENTED = ConfigDict(extra="allow", defer_build=True, json_schema_extra=no_defaults)
PADDED_SEQ = r"^[0-9]{18}$"
# (``int | Absent = None``) a field that may be left out but is never null
Absent = SkipJsonSchema[None]


class ErrorDetail(BaseModel):
    """Some errors add fields (`field`, `knownAgents`, `hostRunId`, `options`, ...)."""

    model_config = DOCUMENTED
    code: str = Field(min_length=1)
    message: str
    field: str | None = None


class Error(BaseModel):
    """The gateway's JSON error: `{"error": {"code", "message", ...}}`."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    error: ErrorDetail


class AgentId(RootModel[str]):
    """A registered agent (the served document lists them as an enum)."""

    model_config = ConfigDict(defer_build=True)
    root: Identifier


class Projection(RootModel[str]):
    """Event projection: ui, openai, or one a plugin registers (the served document lists them as an enum)."""

    model_config = ConfigDict(defer_build=True)
    root: str = "ui"


class Event(BaseModel):
    """One journal event on the wire (gateway.run_event.v1)."""

    model_config = DOCUMENTED
    schema_: Literal["gateway.run_event.v1"] = Field(alias="schema")
    hostRunId: str
    seq: str = Field(pattern=PADDED_SEQ)
    kind: str
    source: str
    payload: dict[str, Any]
    createdAt: int


class EventPage(BaseModel):
    """A page of a run's events (gateway.run_events.v1)."""

    model_config = DOCUMENTED
    schema_: Literal["gateway.run_events.v1"] = Field(alias="schema")
    hostRunId: str
    events: list[dict[str, Any]] = Field(
        description="gateway.run_event.v1 objects (the ui projection), or what the chosen projection makes of them."
    )
    nextCursor: str = Field(pattern=PADDED_SEQ)
    complete: bool


class SseEvent(BaseModel):
    """One SSE event as sent: `id` (the padded seq), `event` (the kind), `data` (the event JSON). `: ping` comments
    are heartbeats."""

    model_config = DOCUMENTED
    id: str = Field(pattern=PADDED_SEQ)
    event: str = Field(min_length=1)
    data: str = Field(json_schema_extra={"contentMediaType": "application/json"})
    retry: int | Absent = None


class PreferenceValues(RootModel[dict[str, Any]]):
    """Preference keys (ai.common.<name>, ai.agent.<agentId>.<name>, as the agent descriptors declare them) to
    values; null removes a key. The served document lists every key with its type."""

    model_config = ConfigDict(defer_build=True)
    root: dict[str, Any] = Field(max_length=200)


class SecretState(BaseModel):
    """A secret preference as it is shown: only that it is set."""

    model_config = DOCUMENTED
    isSet: Literal[True] = True


class Preferences(BaseModel):
    """The calling actor's preferences (gateway.preferences.v1); secrets only as isSet."""

    model_config = DOCUMENTED
    schema_: Literal["gateway.preferences.v1"] = Field(alias="schema")
    actorId: str
    values: dict[str, Any]
    secrets: dict[str, SecretState]


class DescriptorField(BaseModel):
    """One preference field an agent descriptor declares."""

    model_config = DOCUMENTED
    key: str
    kind: str


class AgentDescriptor(BaseModel):
    """One agent as the calling actor sees it (gateway.agent_descriptor.v1)."""

    model_config = DOCUMENTED
    schema_: Literal["gateway.agent_descriptor.v1"] = Field(alias="schema")
    agentId: str
    displayName: str
    provider: str
    capabilities: list[str]
    fields: list[DescriptorField]


class JsonRpcMessage(RootModel[dict[str, Any] | list[Any]]):
    """A JSON-RPC 2.0 message or batch."""

    model_config = ConfigDict(defer_build=True)


class JsonRpcError(RootModel[dict[str, Any] | list[Any]]):
    """A JSON-RPC error response (one per request of a batch)."""

    model_config = ConfigDict(defer_build=True)


class ReceiptLocation(BaseModel):
    """A place an agent-reported call named (never resolved on the host)."""

    model_config = DOCUMENTED
    path: str = Field(max_length=1001)
    line: Annotated[int, Field(ge=0)] | Absent = None


ToolCallKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "other"]


class ToolReceipt(BaseModel):
    """One tool call on a run's audit trail (gateway.tool_receipt.v1). `source` says who reports it. `gateway`: a
    call through the gateway's tool facade (MCP, the ACP fs/* methods, plugin routes), checked and recorded by the
    gateway: `tool`, `path` (normalised), `allowed`, `status` completed|denied|failed, `errorCode`, `reason`,
    `diffSummary`, versions, `caller`. `agent`: a call the agent reported running with its own tools (an ACP
    tool_call / tool_call_update, a Pi tool execution), recorded as the agent described it, untrusted: `kind`,
    `title` (at most 500 characters, then an ellipsis), `locations` (at most 10, each path at most 1000 characters,
    never resolved on the host), `inputSummary` (the first 200 characters of its raw input as JSON; never its
    output), `status` completed|failed, or its last status (pending|in_progress) when the turn ended before the call
    did. A run keeps at most 1000 agent receipts; past that, one receipt with `status` truncated, `limit` and
    `omittedCalls`. A receipt stored before sources were recorded has no `source`: it is a gateway receipt."""

    model_config = DOCUMENTED
    schema_: str | Absent = Field(None, alias="schema")
    receiptId: str | Absent = None
    source: Literal["gateway", "agent"] | Absent = None
    agentId: str | None = None
    toolCallId: str | None = Field(None, max_length=201)
    hostRunId: str
    actorId: str
    workspaceId: str | None = None
    agentSessionId: str | None = None
    status: str | None = Field(
        None,
        description="gateway: completed, denied or failed; agent: completed, failed, pending, in_progress or truncated",
    )
    createdAt: int | Absent = Field(
        None, description="When the call ended (ms since the epoch); receipts are listed by it"
    )
    tool: str | None = Field(
        None, description="The tool's name (an agent receipt has it when the runtime reports one, e.g. Pi)"
    )
    allowed: bool | Absent = None
    errorCode: str | None = None
    reason: str | None = None
    root: str | None = None
    page: str | None = None
    targetSnapshotHash: str | None = None
    path: str | None = None
    requestedPath: Any = None
    diffSummary: dict[str, Any] | None = None
    beforeVersion: dict[str, Any] | None = None
    afterVersion: dict[str, Any] | None = None
    model: str | None = None
    caller: str | Absent = None
    note: str | Absent = None
    kind: ToolCallKind | None = None
    title: str | None = Field(None, max_length=501)
    locations: Annotated[list[ReceiptLocation], Field(max_length=10)] | Absent = None
    inputSummary: str | None = Field(None, max_length=201)
    startedAt: int | Absent = Field(
        None, description="When the gateway saw the call's first event (ms since the epoch)"
    )
    limit: int | Absent = None
    omittedCalls: int | Absent = Field(
        None, description="Agent-reported calls left without a receipt once the run had `limit`"
    )


class WebhookState(BaseModel):
    """A run's webhook delivery: attempts, last answer, outcome."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    webhookId: str = Field(description="The webhook-id header of every attempt (receivers deduplicate on it).")
    url: str
    state: Literal["pending", "delivered", "failed", "refused"] = Field(
        description="pending: the run has not ended, or a retry is due; delivered: a 2xx answer; failed: "
        "retry_for_seconds ran out; refused: the host resolves to an address allowed_hosts does not list."
    )
    attempts: int = Field(ge=0)
    lastStatus: int | None = Field(description="The HTTP status of the last attempt (null: no answer).")
    lastError: str | None
    firstAttemptAt: int | None
    lastAttemptAt: int | None
    deliveredAt: int | None
    nextAttemptAt: int | None = Field(description="When the next retry is due (ms since the epoch).")


class WebhookDelivery(BaseModel):
    """A run's webhook delivery (webhook null: the run has none)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)
    hostRunId: str
    webhook: WebhookState | None


# Every component schema of the core's document that is no route's body (those come with their routes).
COMPONENTS: tuple[type[BaseModel], ...] = (
    Error,
    AgentId,
    Projection,
    Event,
    EventPage,
    SseEvent,
    PreferenceValues,
    Preferences,
    AgentDescriptor,
    JsonRpcMessage,
    JsonRpcError,
    ToolReceipt,
    WebhookDelivery,
)

__all__ = ["COMPONENTS", "MULTITASK_STRATEGIES", "VISIBLE_PATTERN", "Error", "Run", "RunContext", "RunRequest"]
