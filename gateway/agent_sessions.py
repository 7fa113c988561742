"""Deleting an agent's own session: a separate, explicit call, offered only when the runtime
declares it (docs/sessions.md).

A runtime declares it in one of two ways:

- its own methods: ``can_delete_agent_session() -> bool`` and
  ``async delete_agent_session(agent_session_id, state)``;
- an ACP runtime: the agent's ``initialize`` answer has ``agentCapabilities.sessionCapabilities.
  delete``. The gateway then starts a short-lived agent process of that runtime, initializes it,
  sends ``session/delete`` and stops it; a live binding of that agent session is closed first, so
  no later turn prompts a deleted session.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from agent_gateway.acp.client import AcpProcess
from agent_gateway.acp.runtime import AcpRuntime
from agent_gateway.environment import agent_environment

log = logging.getLogger(__name__)

ACP_DELETE_METHOD = "session/delete"


class NotDeclared(Exception):
    """The runtime does not offer deleting its sessions."""


def _acp_declares_delete(initialize_result: dict[str, Any] | None) -> bool | None:
    if initialize_result is None:
        return None
    caps = initialize_result.get("agentCapabilities")
    session_caps = caps.get("sessionCapabilities") if isinstance(caps, dict) else None
    return isinstance(session_caps, dict) and session_caps.get("delete") is not None


def declares_delete(runtime: Any) -> bool | None:
    """True when the runtime offers deleting its own sessions, False when not, None when it cannot
    tell yet (an ACP agent this process has not started: its capabilities are unknown)."""
    own = getattr(runtime, "can_delete_agent_session", None)
    if callable(own):
        return bool(own()) and callable(getattr(runtime, "delete_agent_session", None))
    if isinstance(runtime, AcpRuntime):
        return _acp_declares_delete(runtime.initialize_result)
    return False


async def delete_agent_session(runtime: Any, agent_session_id: str, state: dict[str, Any], data_dir: Path) -> None:
    """Ask the runtime's agent to delete ``agent_session_id``. Raises NotDeclared when the runtime
    does not offer it; any other exception is the agent's failure."""
    own = getattr(runtime, "delete_agent_session", None)
    if callable(getattr(runtime, "can_delete_agent_session", None)):
        if not declares_delete(runtime):
            raise NotDeclared
        await own(agent_session_id, state)  # type: ignore[misc]
        return
    if not isinstance(runtime, AcpRuntime) or declares_delete(runtime) is False:
        raise NotDeclared
    await _close_live_bindings(runtime, agent_session_id)
    spec = runtime.spec
    process_dir = spec.process_dir or (data_dir / "agent-sessions")
    process_dir.mkdir(parents=True, exist_ok=True)
    if spec.prepare is not None:
        spec.prepare(process_dir)
    process = AcpProcess(
        spec.command,
        env=agent_environment(spec.env, inherit=spec.inherit_env),
        cwd=str(process_dir),
        name=f"{spec.agent_id}-delete",
    )
    try:
        await process.start()
        result = await process.initialize(timeout=spec.initialize_timeout)
        if runtime.initialize_result is None:
            runtime.initialize_result = result
        if not _acp_declares_delete(result):
            raise NotDeclared
        await process.request(ACP_DELETE_METHOD, {"sessionId": agent_session_id}, spec.session_timeout)
    finally:
        await process.close()


async def _close_live_bindings(runtime: AcpRuntime, agent_session_id: str) -> None:
    """Close an idle live process bound to that agent session, so the next turn starts anew.
    (Uses the runtime's binding table; a busy binding means an active run, refused before this.)"""
    bindings = getattr(runtime, "_bindings", {})
    close = getattr(runtime, "_close_binding", None)
    for binding in list(bindings.values()):
        if getattr(binding, "agent_session_id", None) == agent_session_id and close is not None:
            with contextlib.suppress(Exception):
                await close(binding, "its agent session was deleted")
