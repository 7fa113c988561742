"""Tool facade family: tools agents may call, and hooks around every call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_gateway.hookspecs import hookspec


@hookspec
def register_tools(register: Callable[[Any], None], config: Any) -> None:
    """Register tools for the tool facade.

    Call ``register(tool)`` with a :class:`gateway.tools.Tool` (name, JSON schema of its
    arguments, capability ids, async handler). Every runtime reaches registered tools through
    the one MCP surface. Called once when the app is created.
    """


@hookspec(firstresult=True)
def tool_call_veto(call: Any) -> str | None:
    """Return a reason string to refuse ``call`` (a :class:`gateway.tools.ToolCall`), or None.

    Runs after argument validation, path normalisation, the allowed-roots check and the
    version check, before the handler. The first reason wins and is written to the receipt.
    """


@hookspec
def tool_call_completed(call: Any, receipt: dict[str, Any]) -> None:
    """Observe a finished tool call (allowed or denied) and its stored receipt. All are called."""
