"""Deleting an agent's own session: a separate, explicit call, offered only when the runtime
declares it (docs/sessions.md).

A runtime declares it with two methods of its own (the core knows no runtime by name):

- ``can_delete_agent_session() -> bool | None``: True when it offers deleting its sessions, False
  when not, None when it cannot tell yet (an ACP agent no process of which has started);
- ``async delete_agent_session(agent_session_id, state)``: delete it; raise :class:`NotDeclared`
  when it turns out not to be offered, anything else is the agent's failure.

ACP runtimes (``agent_gateway.acp.runtime.AcpRuntime``) implement both from the agent's
``initialize`` answer (``agentCapabilities.sessionCapabilities.delete``).
"""

from __future__ import annotations

from typing import Any


class NotDeclared(Exception):
    """The runtime does not offer deleting its sessions."""


def declares_delete(runtime: Any) -> bool | None:
    """True when the runtime offers deleting its own sessions, False when not, None when it cannot
    tell yet (an ACP agent this process has not started: its capabilities are unknown)."""
    own = getattr(runtime, "can_delete_agent_session", None)
    if not callable(own) or not callable(getattr(runtime, "delete_agent_session", None)):
        return False
    declared = own()
    return None if declared is None else bool(declared)


async def delete_agent_session(runtime: Any, agent_session_id: str, state: dict[str, Any]) -> None:
    """Ask the runtime's agent to delete ``agent_session_id``. Raises NotDeclared when the runtime
    does not offer it; any other exception is the agent's failure."""
    if declares_delete(runtime) is False:
        raise NotDeclared
    await runtime.delete_agent_session(agent_session_id, state)
