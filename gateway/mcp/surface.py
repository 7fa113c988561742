"""The gateway's MCP surface as one object: its lease registry, its JSON-RPC server over the tool
facade, and what leases resolve against (the active runs, the gateway's own URL). The gateway
builds one; ``agent_gateway.mcp.http`` serves it and ``agent_gateway.mcp.wiring`` issues its
leases."""

from __future__ import annotations

from collections.abc import Callable

from agent_gateway.mcp.leases import McpLeases
from agent_gateway.mcp.server import McpServer
from agent_gateway.models import Run
from agent_gateway.tools import ToolFacade


class McpSurface:
    def __init__(
        self,
        tools: ToolFacade,
        active_runs: Callable[[], list[Run]],
        base_url: Callable[[], str | None],
    ) -> None:
        self.tools = tools
        self.leases = McpLeases(tools.scope_for)
        self.server = McpServer(tools)
        self._active_runs = active_runs
        self._base_url = base_url

    def active_runs(self) -> list[Run]:
        """The runs active on this instance (what a session lease attributes calls to)."""
        return self._active_runs()

    @property
    def base_url(self) -> str | None:
        """The gateway's own URL without a trailing slash, None while unknown."""
        url = self._base_url()
        return str(url).rstrip("/") if url else None
