"""MCP JSON-RPC handling, independent of the transport: the tool facade as an MCP server.

:meth:`McpServer.handle` takes one parsed JSON-RPC message (or a batch array) and the
:class:`RunScope` the caller's credential resolved to, and returns the response (None for a
notification or a batch of notifications). Methods:

- ``initialize``: answers the client's ``protocolVersion`` when it is one of
  :data:`PROTOCOL_VERSIONS`, else the latest; declares the ``tools`` capability only.
- ``notifications/initialized``, ``notifications/cancelled`` and other notifications: accepted.
- ``ping``: ``{}``.
- ``tools/list``: the facade's tools for the run (``ToolFacade.list_tools(scope)``); no paging.
- ``tools/call``: ``ToolFacade.call(name, arguments, scope, caller="mcp")``. A result is
  ``{"content": [text of the JSON result], "structuredContent": result, "isError": false}``; a
  refused or failed call (:class:`ToolError`, unknown tools included) is a *result* with
  ``isError: true`` and the text ``"<code>: <message>"`` — tool errors are for the model to read,
  not JSON-RPC errors (MCP spec, "Error Handling").
- anything else (``server/discover``, ``resources/list``, ...): ``-32601`` method not found.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agent_gateway.tools import RunScope, ToolError, ToolFacade

log = logging.getLogger("agent_gateway.mcp.server")

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_PROTOCOL_VERSION = PROTOCOL_VERSIONS[-1]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Server-defined: the credential does not authorise calls now (unknown/revoked, or no active run).
UNAUTHORIZED = -32001

INSTRUCTIONS = (
    "Tools of the Agent Gateway for the current run. File paths are relative to the workspace and "
    "must lie below one of the run's allowed roots (workspace.describe_roots lists them). Every call "
    "is checked and recorded in a receipt; a refused call returns isError with '<code>: <message>'."
)


def error_response(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def result_response(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def request_ids(message: Any) -> list[Any]:
    """The ids of the requests (not notifications) in a message or batch, for error replies."""
    items = message if isinstance(message, list) else [message]
    return [m["id"] for m in items if isinstance(m, dict) and "method" in m and m.get("id") is not None]


def is_notification_only(message: Any) -> bool:
    """True when nothing in ``message`` expects an answer (notifications and client responses)."""
    items = message if isinstance(message, list) else [message]
    return bool(items) and all(isinstance(m, dict) and ("method" not in m or m.get("id") is None) for m in items)


def refusal(message: Any, code: int, text: str) -> dict[str, Any] | list[dict[str, Any]] | None:
    """The same JSON-RPC error for every request in ``message`` (a batch gets an array)."""
    ids = request_ids(message)
    if isinstance(message, list):
        return [error_response(i, code, text) for i in ids] or None
    if not isinstance(message, dict):
        return error_response(None, code, text)
    return error_response(ids[0], code, text) if ids else None


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, str | int) and not isinstance(value, bool))


class McpServer:
    """The tool facade as an MCP server (one instance serves every caller and transport)."""

    def __init__(self, facade: ToolFacade, *, name: str = "agent-gateway", version: str | None = None) -> None:
        if version is None:
            from agent_gateway import __version__

            version = __version__
        self.facade = facade
        self.server_info = {"name": name, "title": "Agent Gateway", "version": version}

    async def handle(self, message: Any, scope: RunScope) -> dict[str, Any] | list[dict[str, Any]] | None:
        """The response to one message or batch; None when nothing is to be sent back."""
        if isinstance(message, list):
            if not message:
                return error_response(None, INVALID_REQUEST, "an empty batch is not a valid request")
            answers = [await self._one(item, scope) for item in message]
            out = [a for a in answers if a is not None]
            return out or None
        return await self._one(message, scope)

    async def _one(self, message: Any, scope: RunScope) -> dict[str, Any] | None:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            request_id = message.get("id") if isinstance(message, dict) and _valid_id(message.get("id")) else None
            return error_response(request_id, INVALID_REQUEST, 'not a JSON-RPC 2.0 message (need "jsonrpc": "2.0")')
        if "method" not in message:
            return None  # a response to a request we never send (or a stray one): nothing to answer
        method = message.get("method")
        request_id = message.get("id")
        is_notification = "id" not in message
        if not isinstance(method, str) or not _valid_id(request_id):
            return error_response(
                request_id if _valid_id(request_id) else None,
                INVALID_REQUEST,
                "method must be a string and id a string, a number or null",
            )
        params = message.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return None if is_notification else error_response(request_id, INVALID_PARAMS, "params must be an object")
        if is_notification:
            return None  # notifications/initialized, notifications/cancelled, ...: nothing to do
        try:
            if method == "initialize":
                return result_response(request_id, self.initialize(params))
            if method == "ping":
                return result_response(request_id, {})
            if method == "tools/list":
                return result_response(request_id, {"tools": self.facade.list_tools(scope)})
            if method == "tools/call":
                return await self._call(request_id, params, scope)
        except Exception:
            log.exception("MCP %s failed", method)
            return error_response(request_id, INTERNAL_ERROR, f"internal error in {method}; see the gateway log")
        return error_response(request_id, METHOD_NOT_FOUND, f"method not found: {method[:100]}")

    def initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": dict(self.server_info),
            "instructions": INSTRUCTIONS,
        }

    async def _call(self, request_id: Any, params: dict[str, Any], scope: RunScope) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str) or not name:
            return error_response(request_id, INVALID_PARAMS, "tools/call needs params.name (a string)")
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        try:
            result = await self.facade.call(name, arguments, scope, caller="mcp")
        except ToolError as exc:
            return result_response(
                request_id,
                {"content": [{"type": "text", "text": f"{exc.code}: {exc.message}"}], "isError": True},
            )
        text = json.dumps(result, ensure_ascii=False, default=str)
        return result_response(
            request_id,
            {"content": [{"type": "text", "text": text}], "structuredContent": result, "isError": False},
        )
