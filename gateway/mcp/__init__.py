"""The gateway's one tool surface for agents: the tool facade served as an MCP server.

- :mod:`agent_gateway.mcp.server`: transport-independent MCP JSON-RPC handling (``initialize``,
  ``ping``, ``tools/list``, ``tools/call``) over a :class:`agent_gateway.tools.ToolFacade`.
- :mod:`agent_gateway.mcp.leases`: the credentials. A lease token is bound to one agent binding (or one
  run) and is good only while one of its runs is active; each call is attributed to that run.
- :mod:`agent_gateway.mcp.http`: ``POST /v1/mcp`` (streamable HTTP, JSON responses), authorised by a
  lease token, not by the actor tokens.
- :mod:`agent_gateway.mcp.bridge`: the stdio bridge (``python -m agent_gateway.mcp.bridge`` /
  ``agent-gateway mcp-bridge``) that relays newline-delimited JSON-RPC to ``/v1/mcp``.
- :mod:`agent_gateway.mcp.wiring`: the ``mcpServers`` entries for ACP ``session/new`` (runtimes with
  another config format convert them).

This package imports nothing heavy at import time: the bridge starts in a fresh interpreter for
every agent session and must be quick.
"""

MCP_PATH = "/v1/mcp"
TOKEN_ENV = "AGENT_GATEWAY_MCP_TOKEN"
SERVER_NAME = "gateway"

__all__ = ["MCP_PATH", "SERVER_NAME", "TOKEN_ENV"]
