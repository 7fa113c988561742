"""The core's OpenAPI 3.1 document, every part of it declared in Python: its info and security
schemes here, the shared error responses (the :class:`~agent_gateway.api_models.Error` body under
the names of ``declare.ERROR_RESPONSES``), the component models of ``api_models.COMPONENTS``, and
the operations of the core's declared routes. ``routes/system.py`` builds it on the first
``/openapi.json`` request (never at import: start-up does not pay for the models' schemas) and
adds the plugins' routes and what only the running gateway knows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent_gateway.api_models import COMPONENTS, Error
from agent_gateway.declare import ERROR_RESPONSES, Route, RouteResponse, declared_paths, merge_components, model_schemas

OPENAPI_VERSION = "3.1.0"
INFO: Mapping[str, str] = {
    "title": "Agent Gateway",
    "version": "1.0.0",
    "description": "Runs, resumable event journals and agent descriptors. Every error is JSON, "
    '{"error": {"code", "message", ...}}, including the HTTP parser\'s (a 405 carries `Allow`). A request the HTTP '
    "parser refuses (an over-long path or header, too many query parameters) is a 400 too. Text anywhere in a JSON "
    "body (keys and values) must be valid Unicode without NUL characters: a NUL or a lone surrogate is a 400 "
    "`invalid_text` naming the field; bodies nest at most 64 levels (400 `json_too_deep`). Any route may answer 403 "
    "(browser guard) and 503 (storage or connection limits). The agent ids, projections and preference keys of "
    "this gateway are filled in when it serves this document.",
}
SECURITY_SCHEMES: Mapping[str, Mapping[str, str]] = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An actor token from [auth] tokens; with none configured, no token is needed (loopback only).",
    },
    "leaseToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "A run-scoped MCP lease token the gateway gives an agent for one run.",
    },
}
# Every operation's unless it says otherwise (the served document drops it with no [auth] tokens).
SECURITY = ({"bearer": []},)


def retry_after(required: bool) -> dict[str, Any]:
    """The ``Retry-After`` response header: whole seconds to wait."""
    return {
        "Retry-After": {
            "required": required,
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
            "description": "Seconds to wait",
        }
    }


# The shared error responses (components/responses, named by ERROR_RESPONSES), each the JSON error.
SHARED_ERRORS: Mapping[int, RouteResponse] = {
    400: RouteResponse(
        "The request is malformed: bad JSON (`invalid_json`, `json_too_deep`), text with a NUL or a lone surrogate "
        "(`invalid_text`, with `field`), a field or parameter out of its schema (`invalid_request`, "
        "`invalid_cursor`, ...).",
        Error,
    ),
    401: RouteResponse(
        "Authentication is configured (`[auth] tokens`, `[auth_jwt]`, an `authenticate` plugin) and the request has "
        "no `Authorization: Bearer <token>`, or one nobody accepts (`unknown token`, or the reason a JWT is invalid).",
        Error,
    ),
    403: RouteResponse(
        "Refused by the browser guard (`host_not_allowed`: with no tokens only loopback Host names; "
        "`origin_not_allowed`; `client_signal_required`: a body-less state-changing request with no tokens needs "
        "`Content-Type: application/json` or `X-Agent-Gateway-Client`), or an admin-only setting (`admin_only`), or "
        "denied by an `authorize` hook (`forbidden`, with the `action`: docs/auth.md).",
        Error,
    ),
    404: RouteResponse(
        "No such resource for the calling actor (another actor's run or workspace is a 404 too).",
        Error,
    ),
    405: RouteResponse(
        "The path does not take this method; `Allow` lists the ones it takes.",
        Error,
        headers={"Allow": {"required": True, "schema": {"type": "string"}}},
    ),
    409: RouteResponse("The request conflicts with the resource's state.", Error),
    413: RouteResponse("The body exceeds `[gateway] max_body_bytes`.", Error),
    415: RouteResponse("The body is not `application/json`.", Error),
    429: RouteResponse(
        "A bound was reached (the session's queue of runs, the actor's active runs, the actor's journal bytes for the "
        "day); retry after `Retry-After` seconds.",
        Error,
        headers=retry_after(required=True),
    ),
    503: RouteResponse(
        "Storage is unreachable (`storage_unavailable`), the gateway holds its maximum of open connections, or "
        "(creating a run) the agent cannot run here (`agent_unavailable`, with `agentId` and `reason`: what to install "
        "or set; `x-should-retry: false`, no `Retry-After`); retry after `Retry-After` seconds when given.",
        Error,
        headers=retry_after(required=False),
    ),
}


def core_document(routes: Iterable[Route[Any, Any, Any]]) -> dict[str, Any]:
    """The core's document: ``routes``' operations, the shared error responses and every component
    schema (those no route refers to as well: plugins name them, ``Error`` and ``AgentId`` most)."""
    if set(SHARED_ERRORS) != set(ERROR_RESPONSES):  # (a status declared without its response, or back)
        raise AssertionError("SHARED_ERRORS and declare.ERROR_RESPONSES name different statuses")
    schemas: dict[str, Any] = {}
    for model in COMPONENTS:
        merge_components(schemas, model_schemas(model, "serialization")[1], "the core's component schemas")
    responses: dict[str, Any] = {}
    for status, response in SHARED_ERRORS.items():
        responses[ERROR_RESPONSES[status]], needed = response.openapi_response()
        merge_components(schemas, needed, "the shared error responses")
    paths, declared = declared_paths(routes)
    merge_components(schemas, declared, "the core's declared routes")
    return {
        "openapi": OPENAPI_VERSION,
        "info": dict(INFO),
        "components": {
            "securitySchemes": {name: dict(scheme) for name, scheme in SECURITY_SCHEMES.items()},
            "responses": responses,
            "schemas": schemas,
        },
        "security": [dict(requirement) for requirement in SECURITY],
        "paths": paths,
    }
