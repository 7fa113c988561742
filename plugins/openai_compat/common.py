"""What the chat and Responses declarations (``chat_api``, ``responses_api``) share: the OpenAI
error body and the error answers every route has, the request headers, and the fields both
requests have (``model``, ``metadata``, ``tools``, a structured output's ``type``), refused in the
same words. Imports nothing of the plugin, so every module of it may import this one.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from agent_gateway import VISIBLE, RouteResponse, refuse

TAG = "openai-compatible (plugin)"
MAX_ID_LENGTH = 200
MAX_TOOLS = 128
TOOL_CHOICES = frozenset({"auto", "none", "required"})


def tool_choice_kind(value: Any) -> str | None:
    """A ``tool_choice``'s union member (chat and Responses alike): a mode, or an object."""
    if isinstance(value, dict):
        return "<object>"
    return "<mode>" if isinstance(value, str) and value in TOOL_CHOICES else None


FORMAT_TYPES = ("text", "json_object", "json_schema")
SESSION_HEADER = "X-Agent-Gateway-Session"
AFFINITY_HEADER = "X-Agent-Gateway-Session-Affinity"
MULTITASK_HEADER = "X-Agent-Gateway-Multitask"
IDEMPOTENCY_HEADER = "Idempotency-Key"
IGNORED_HEADER = "X-Agent-Gateway-Ignored"


# -- the OpenAI error body -----------------------------------------------------------------------------
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}


def openai_error(status: int, code: str, message: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}`` (every route's
    ``error_shape``)."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    param = extra.get("param", extra.get("field"))
    return {
        "error": {"message": message, "type": kind, "param": param if isinstance(param, str) else None, "code": code}
    }


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


def error_answer(description: str) -> RouteResponse:
    """A status answered with the OpenAI error body."""
    return RouteResponse(description, OpenAIError)


UNAVAILABLE = "The gateway's database is unreachable, or the gateway is stopping (OpenAI error body)."
# What any of these routes may answer (the core's middleware, in OpenAI's error shape).
COMMON_ERRORS: dict[int | str, RouteResponse] = {
    401: error_answer(
        "Tokens are configured and the request has no `Authorization: Bearer <token>` or an unknown one "
        "(OpenAI error body)."
    ),
    403: error_answer("Refused by the browser guard: a non-loopback Host or a disallowed origin (OpenAI error body)."),
    503: error_answer(UNAVAILABLE),
}
BAD_REQUEST = (
    "The request is malformed (OpenAI error body; `param` names the field): bad JSON, JSON nested deeper than "
    "64 levels, text with a NUL or a lone surrogate, a field of the wrong type, no user message"
)
CONFLICT = (
    "The `Idempotency-Key` was used before with a different request (`request_conflict`), or the session "
    "still answers and the request's multitask strategy is `reject` (`session_busy`)."
)
TOO_LARGE = "The body exceeds `[gateway] max_body_bytes` (OpenAI error body)."
NOT_JSON = "The body is not `application/json` (OpenAI error body)."
ADMISSION = (
    "Run admission refused: the session's queue or the caller's active runs are full; retry after "
    "`Retry-After` seconds (OpenAI error body)."
)
AGENT_UNAVAILABLE = (
    UNAVAILABLE + " Or the agent cannot run here (`code` `agent_unavailable`, `param` `model`; the message says "
    "what to install or set), with `x-should-retry: false`."
)


# -- the request headers of a run -----------------------------------------------------------------------
ID_HEADER_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH, "pattern": VISIBLE.pattern}
RUN_HEADERS: tuple[dict[str, Any], ...] = (
    {
        "name": SESSION_HEADER,
        "in": "header",
        "schema": ID_HEADER_SCHEMA,
        "description": "The gateway session of this request; wins over `metadata.session_id`, "
        "`previous_response_id` and `user`.",
    },
    {
        "name": MULTITASK_HEADER,
        "in": "header",
        "schema": {"type": "string", "enum": ["enqueue", "reject", "interrupt", "rollback"]},
        "description": "What this request does while a run of its session is still active (wins over "
        "`metadata.multitask_strategy`): `enqueue` waits behind it, `reject` answers 409 `session_busy`, "
        "`interrupt` cancels it (the agent still knows the cut-off turn), `rollback` cancels it and the agent "
        "forgets it (400 `rollback_not_supported` for an agent that keeps its own session). Default: the "
        "gateway's `multitask_strategy` configuration.",
    },
    {
        "name": IDEMPOTENCY_HEADER,
        "in": "header",
        "schema": ID_HEADER_SCHEMA,
        "description": "The run's requestId: a repeat with the same key (same session and body) returns the same run.",
    },
)


# -- the fields both requests have ----------------------------------------------------------------------
def wrong(kind: str, phrase: str) -> PydanticCustomError:
    """A refusal worded ``<field> <phrase>`` (the field from the error's location)."""
    return PydanticCustomError(kind, phrase)


def _agent_id(value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise wrong("model", "must be an agent id (see GET /v1/models)")
    return value


def _metadata(value: Any) -> Any:
    # (checked whole: a bad value is refused at `metadata`, not at the key a client chose)
    if value is not None and (not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())):
        raise wrong("metadata", "must be an object of strings")
    return value


def tool_list(value: Any) -> Any:
    """A request's ``tools``: null, or a list of at most :data:`MAX_TOOLS`."""
    if value is not None and (not isinstance(value, list) or len(value) > MAX_TOOLS):
        raise wrong("tools", f"must be a list of at most {MAX_TOOLS} tools")
    return value


def format_type(value: Any, where: str, param: str) -> Any:
    """A structured output format (``where``) whose ``type`` is one the gateway knows."""
    if isinstance(value, dict) and value.get("type") not in FORMAT_TYPES:
        raise refuse("invalid_request", f"{where}.type must be 'text', 'json_object' or 'json_schema'", param=param)
    return value


AgentId = Annotated[str, Field(min_length=1, description="An agent id (GET /v1/models)"), BeforeValidator(_agent_id)]
Metadata = Annotated[
    dict[str, str] | None,
    Field(
        description="Strings. `session_id` names the gateway session (the agent's live session is kept across "
        "requests), `workspace_id` the workspace (default `default`), `allowed_roots` the workspace folders its "
        "tools may touch, comma-separated (`.`: all; without it, none), `multitask_strategy` what the request "
        f"does while the session still answers (as the `{MULTITASK_HEADER}` header)."
    ),
    BeforeValidator(_metadata),
]
