"""The core's declared request and response bodies (see :mod:`agent_gateway.declare`).

Their class names are their component names in ``/openapi.json`` (``RunRequest``, ``Run``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
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


__all__ = ["MULTITASK_STRATEGIES", "VISIBLE_PATTERN", "Run", "RunContext", "RunRequest"]
