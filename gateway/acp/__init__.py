"""ACP (Agent Client Protocol) client transport for runtime plugins.

:class:`AcpProcess` runs one agent subprocess and speaks JSON-RPC 2.0 to it over
newline-delimited stdio; :func:`map_update` turns a raw ``session/update`` into
a gateway event ``(kind, payload)``. Nothing here knows a runtime by name.
"""

from __future__ import annotations

from agent_gateway.acp.client import (
    CANCELLED_PERMISSION,
    PROTOCOL_VERSION,
    AcpError,
    AcpProcess,
    AcpProcessExited,
    AcpRemoteError,
    AcpRequestError,
    AcpTimeout,
    NotificationHandler,
    RequestHandler,
    UpdateHandler,
)
from agent_gateway.acp.mapping import UPDATE_KINDS, extract_text, map_update

__all__ = [
    "CANCELLED_PERMISSION",
    "PROTOCOL_VERSION",
    "UPDATE_KINDS",
    "AcpError",
    "AcpProcess",
    "AcpProcessExited",
    "AcpRemoteError",
    "AcpRequestError",
    "AcpTimeout",
    "NotificationHandler",
    "RequestHandler",
    "UpdateHandler",
    "extract_text",
    "map_update",
]
