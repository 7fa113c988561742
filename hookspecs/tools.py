"""Tool facade family: tools agents may call, and hooks around every call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.tools import Tool, ToolCall


@hookspec
def register_tools(register: Callable[[Tool], None], config: Config) -> None:
    """Register tools for the tool facade.

    Call ``register(tool)`` with an :class:`agent_gateway.Tool` (name, JSON schema of its
    arguments, capability ids, async handler). Every runtime reaches registered tools through
    the one MCP surface. Called once when the app is created.
    """


@hookspec(firstresult=True)
def tool_call_veto(call: ToolCall) -> str | None:
    """Return a reason string to refuse ``call`` (an :class:`agent_gateway.ToolCall`), or None.

    Runs after argument validation, path normalisation, the allowed-roots check and the
    version check, before the handler. The first reason wins and is written to the receipt.
    """


@hookspec
def tool_call_completed(call: ToolCall, receipt: dict[str, Any]) -> None:
    """Observe a finished tool call (an :class:`agent_gateway.ToolCall`, allowed or denied) and its
    stored receipt. All are called."""
