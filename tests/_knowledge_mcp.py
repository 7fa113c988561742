"""Helpers for tests where an ACP agent calls the gateway's MCP tools (stdio or HTTP)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime, AcpSessionStrategy
from agent_gateway.app import GATEWAY_KEY, Gateway
from agent_gateway.hookspecs import hookimpl
from agent_gateway.runtime import RuntimePolicy, Turn
from tests._harness import FAKE_ACP_AGENT

REPO_ROOT = Path(__file__).resolve().parent.parent


AGENT = "fake-mcp"


PROVIDER = "fake-acp"


class McpAgentPlugin:
    """Registers an AcpRuntime around the fake agent's ``mcp`` behaviour and records the
    ``mcpServers`` entries the gateway gives it."""

    def __init__(self, transport: str) -> None:
        self.transport = transport
        self.runtime: AcpRuntime | None = None
        self.entries: list[dict[str, Any]] = []

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "mcp"]
        if self.transport == "http":
            command.append("--mcp-http")
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        self.runtime = AcpRuntime(AcpAgentSpec(AGENT, "Fake MCP agent", PROVIDER, command, env=env))
        register(self.runtime)

    @hookimpl
    def session_strategy(self, runtime: Any, config: Any) -> Any:
        return AcpSessionStrategy() if runtime is self.runtime and runtime is not None else None

    def record(self, gateway: Gateway) -> None:
        """Wrap the gateway's provider of mcpServers entries to keep what it gives."""
        provide = gateway.turn_services.mcp_servers_for
        assert provide is not None

        def recording(turn: Turn, policy: RuntimePolicy, base_url: str | None = None) -> list[dict[str, Any]]:
            # base_url: where a confined agent reaches the gateway from inside its sandbox.
            entries = provide(turn, policy, base_url=base_url)
            self.entries.extend(entries)
            return entries

        gateway.turn_services.mcp_servers_for = recording


async def serve(client: TestClient, plugin: McpAgentPlugin) -> TestClient:
    """Start ``client`` and give the gateway its own URL (what agents' MCP clients call back)."""
    if client.server.runner is None:
        await client.start_server()
    gateway = client.app[GATEWAY_KEY]
    gateway.set_public_url(str(client.make_url("")))
    plugin.record(gateway)
    return client
