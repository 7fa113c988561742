"""``POST /v1/mcp``: the MCP server over streamable HTTP (JSON responses, no SSE).

Authorisation is ``Authorization: Bearer <lease token>`` (see :mod:`agent_gateway.mcp.leases`), *not*
an actor token: the route must be left out of the actor auth middleware (``MCP_PATH`` in
``agent_gateway.app.PUBLIC_PATHS``). A token that is unknown or revoked, or that has no active run right
now, gets **401** with a JSON-RPC error ``-32001`` in the body (one per request of a batch) and
``WWW-Authenticate: Bearer``.

- a request (or a batch holding one) → 200 ``application/json`` with the response (an array for
  a batch);
- only notifications / client responses → 202, empty body;
- ``initialize`` → the response carries a fresh ``Mcp-Session-Id``; a later request naming a
  session id this token was not given gets 404 (the client must initialize again); requests
  without the header are accepted;
- ``DELETE`` with ``Mcp-Session-Id`` ends that session (204); ``GET`` is not routed, so it is a
  405 with ``Allow`` (no server-sent stream is offered).
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from aiohttp import web

from agent_gateway.api_models import JsonRpcError, JsonRpcMessage
from agent_gateway.declare import Route, RouteResponse
from agent_gateway.errors import parse_json_body
from agent_gateway.mcp import MCP_PATH
from agent_gateway.mcp.leases import LeaseError
from agent_gateway.mcp.server import (
    INVALID_REQUEST,
    PARSE_ERROR,
    UNAUTHORIZED,
    error_response,
    is_notification_only,
    refusal,
)
from agent_gateway.mcp.surface import McpSurface

log = logging.getLogger("agent_gateway.mcp.http")

SESSION_HEADER = "Mcp-Session-Id"


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(body, ensure_ascii=False, default=str),
        content_type="application/json",
        headers=headers,
    )


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


# Declared for the document only: the handlers check a message as JSON-RPC, refusing with its errors.
SESSION_PARAMETER = {"name": SESSION_HEADER, "in": "header", "required": False, "schema": {"type": "string"}}
LEASE_REFUSED = RouteResponse(
    "No, unknown or expired lease token",
    JsonRpcError,
    headers={"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
)
LEASE_TOKEN = {"security": [{"leaseToken": []}]}
MCP_POST: Route[JsonRpcMessage, Any] = Route(
    "POST",
    MCP_PATH,
    "The MCP surface (streamable HTTP, JSON responses) for agents; authorised by a run-scoped lease token, not an "
    "actor token. GET is 405 (no server-initiated stream).",
    operation_id="mcp",
    body=JsonRpcMessage,
    headers=(SESSION_PARAMETER,),
    responses={
        200: RouteResponse(
            "JSON-RPC response(s); an initialize answer carries Mcp-Session-Id",
            JsonRpcMessage,
            headers={SESSION_HEADER: {"required": False, "schema": {"type": "string"}}},
        ),
        202: RouteResponse("Only notifications or responses: accepted, no body"),
        400: RouteResponse("Not JSON, or not a JSON-RPC object or array", JsonRpcError),
        401: LEASE_REFUSED,
        404: RouteResponse("Unknown Mcp-Session-Id: initialize again", JsonRpcError),
    },
    errors=(403, 413, 503),
    openapi=LEASE_TOKEN,
)
MCP_DELETE: Route[Any, Any] = Route(
    "DELETE",
    MCP_PATH,
    "End an MCP session (Mcp-Session-Id)",
    operation_id="mcpEndSession",
    headers=(SESSION_PARAMETER,),
    responses={
        204: RouteResponse("Ended"),
        401: LEASE_REFUSED,
        404: RouteResponse("No or unknown Mcp-Session-Id", JsonRpcError),
    },
    errors=(400, 403, 503),
    openapi=LEASE_TOKEN,
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (MCP_POST, MCP_DELETE)


def _unauthorized(message: Any, text: str) -> web.Response:
    body = refusal(message, UNAUTHORIZED, text) or error_response(None, UNAUTHORIZED, text)
    return _json(body, 401, {"WWW-Authenticate": 'Bearer realm="agent-gateway-mcp"'})


def _has_initialize(message: Any) -> bool:
    items = message if isinstance(message, list) else [message]
    return any(isinstance(m, dict) and m.get("method") == "initialize" and m.get("id") is not None for m in items)


def setup(app: web.Application, mcp: McpSurface) -> None:
    """Add ``POST|DELETE /v1/mcp`` to ``app`` (once: a second call is a no-op)."""
    if any(getattr(r, "canonical", None) == MCP_PATH for r in app.router.resources()):
        return

    async def post(request: web.Request) -> web.StreamResponse:
        leases = mcp.leases
        raw = await request.read()
        try:
            message: Any = parse_json_body(raw)
        except ValueError:  # malformed, too deep or unclean text: a JSON-RPC parse error
            message = None
            parsed = False
        else:
            parsed = True
        try:
            lease = leases.lease(bearer_token(request))
            scope = leases.scope_of(lease)
        except LeaseError as exc:
            return _unauthorized(message, exc.message)
        if not parsed:
            return _json(error_response(None, PARSE_ERROR, "the body is not valid JSON"), 400)
        if not isinstance(message, dict | list):
            return _json(error_response(None, INVALID_REQUEST, "the body must be a JSON-RPC object or array"), 400)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is not None and session_id not in lease.sessions and not _has_initialize(message):
            text = "unknown Mcp-Session-Id; send initialize again"
            return _json(refusal(message, INVALID_REQUEST, text) or error_response(None, INVALID_REQUEST, text), 404)
        response = await mcp.server.handle(message, scope)
        if response is None or is_notification_only(message):
            return web.Response(status=202)
        headers: dict[str, str] = {}
        if _has_initialize(message):
            new_session = secrets.token_urlsafe(16)
            lease.add_session(new_session)
            headers[SESSION_HEADER] = new_session
        return _json(response, 200, headers)

    async def delete(request: web.Request) -> web.StreamResponse:
        try:
            lease = mcp.leases.lease(bearer_token(request))
        except LeaseError as exc:
            return _unauthorized(None, exc.message)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id is None or session_id not in lease.sessions:
            return _json(error_response(None, INVALID_REQUEST, "unknown Mcp-Session-Id"), 404)
        del lease.sessions[session_id]
        return web.Response(status=204)

    app.router.add_route(MCP_POST.method, MCP_POST.path, post)
    app.router.add_route(MCP_DELETE.method, MCP_DELETE.path, delete)
