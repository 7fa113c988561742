"""How agents are given the gateway's MCP server: the ACP ``mcpServers`` entries.

The gateway lends every turn ``mcp_servers_for(mcp)`` (runtimes call ``turn.mcp_servers(policy)``);
the gateway's own URL (:attr:`McpSurface.base_url`) is ``[gateway] public_url``, else the listening
address (set by the launcher, or from the local address of the first accepted connection), never a
request's ``Host`` header (see ``Gateway.set_public_url``).
:class:`agent_gateway.acp.runtime.AcpRuntime` asks at ``session/new`` and ``session/load``; the
entry it gets is

- ``{"type": "http", "name": "gateway", "url": ".../v1/mcp", "headers": [Authorization]}`` when the
  agent declared ``mcpCapabilities.http`` (``policy.mcp_http``), else
- ``{"name": "gateway", "command": <python>, "args": ["-m", "agent_gateway.mcp.bridge", "--url", ...,
  "--token-env", "AGENT_GATEWAY_MCP_TOKEN"], "env": [{"name": "AGENT_GATEWAY_MCP_TOKEN", ...}]}``.

The token is a lease held by the turn's ACP binding (see :mod:`agent_gateway.mcp.leases`): calls are
attributed to the binding's active run (``binding.turn``; while the binding is still being opened,
the turn opening it), refused between runs, and the lease is revoked once the binding's process is
gone. A runtime whose turn has no binding yet when it asks (one that writes an MCP config file while spawning)
gets a *session* lease: attributed to the gateway session's running run of that agent, with the
same pinned actor, workspace and roots (:func:`session_lease`).
"""

from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from agent_gateway.mcp import MCP_PATH, SERVER_NAME, TOKEN_ENV
from agent_gateway.mcp.leases import Resolved, run_pin
from agent_gateway.mcp.surface import McpSurface
from agent_gateway.models import Run
from agent_gateway.runtime import RuntimePolicy, Turn

log = logging.getLogger("agent_gateway.mcp.wiring")

BRIDGE_MODULE = "agent_gateway.mcp.bridge"
DESCRIPTION = "Agent Gateway tools (workspace files, receipts) for the current run"
RUNNING_STATUSES = frozenset({"running", "awaiting_permission"})
SESSION_LEASE_IDLE_SECONDS = 24 * 3600.0


def bridge_command(base_url: str, token_env: str = TOKEN_ENV) -> tuple[str, list[str]]:
    """The stdio bridge's command and args (this interpreter; no plugin loading on start)."""
    return sys.executable, ["-m", BRIDGE_MODULE, "--url", base_url, "--token-env", token_env]


def http_entry(base_url: str, token: str, name: str = SERVER_NAME) -> dict[str, Any]:
    """An ACP ``McpServerHttp``."""
    return {
        "type": "http",
        "name": name,
        "url": base_url.rstrip("/") + MCP_PATH,
        "headers": [{"name": "Authorization", "value": f"Bearer {token}"}],
    }


def stdio_entry(base_url: str, token: str, name: str = SERVER_NAME) -> dict[str, Any]:
    """An ACP ``McpServerStdio`` running the bridge; the token travels in its environment."""
    command, args = bridge_command(base_url.rstrip("/"))
    return {"name": name, "command": command, "args": args, "env": [{"name": TOKEN_ENV, "value": token}]}


def run_lease(mcp: McpSurface, run: Run) -> str:
    """A token good while ``run`` is active (for runtimes without live bindings, and tests)."""

    def resolve() -> Resolved:
        return None if run.is_terminal else run

    return mcp.leases.issue(("run", run.host_run_id), resolve, alive=lambda: not run.is_terminal, pin=run_pin(run))


def session_lease(mcp: McpSurface, run: Run, *, idle_seconds: float = SESSION_LEASE_IDLE_SECONDS) -> str:
    """A lease for an agent process that outlives runs but has no binding object yet when it is
    given its MCP configuration (e.g. a runtime that writes its MCP config file before its binding exists).

    It is keyed by the gateway session (actor, session, agent) and the pinned scope (workspace,
    allowed roots); each call is attributed to that session's run of this agent that is running
    right now (runs of one session never run at the same time). Between runs calls are refused;
    after ``idle_seconds`` without an active run the lease is revoked."""
    pin = run_pin(run)
    owner = (run.actor_id, run.session_id, run.agent_id)
    last_active = [time.monotonic()]

    def resolve() -> Resolved:
        running = [
            r
            for r in mcp.active_runs()
            if (r.actor_id, r.session_id, r.agent_id) == owner and r.status in RUNNING_STATUSES and run_pin(r) == pin
        ]
        if len(running) != 1:
            return None
        last_active[0] = time.monotonic()
        return running[0]

    def alive() -> bool:
        return time.monotonic() - last_active[0] < idle_seconds

    return mcp.leases.issue(("session", *owner, pin), resolve, alive=alive, pin=pin)


def lease_for(
    mcp: McpSurface,
    key: Hashable,
    resolve_active_run: Callable[[], Resolved],
    *,
    alive: Callable[[], bool] | None = None,
    pin: tuple[str, str, tuple[str, ...]] | None = None,
) -> str:
    """A lease for any holder (e.g. an agent process living across runs): see :meth:`McpLeases.issue`."""
    return mcp.leases.issue(key, resolve_active_run, alive=alive, pin=pin)


def binding_lease(mcp: McpSurface, turn: Turn) -> str:
    """The lease of ``turn``'s ACP binding (one per binding, kept while its process lives)."""
    binding = turn.binding
    if binding is None:
        return session_lease(mcp, turn.run)
    ref = weakref.ref(binding)
    opening = weakref.ref(turn)  # the turn that opens (new/load) the session, before binding.turn is set

    def alive() -> bool:
        held = ref()
        return held is not None and bool(getattr(held, "alive", True))

    def resolve() -> Resolved:
        held = ref()
        if held is None or not getattr(held, "alive", True):
            return None
        current = getattr(held, "turn", None)
        if current is None and getattr(held, "busy", False):
            candidate = opening()
            if candidate is not None and candidate.binding is held:
                current = candidate
        if current is None or current.run.is_terminal:
            return None
        run = current.run
        model = (run.request.get("options") or {}).get("model")
        return mcp.tools.scope_for(
            run,
            agent_session_id=getattr(held, "agent_session_id", None) or run.provider_run_id,
            model=model if isinstance(model, str) and model else None,
        )

    return mcp.leases.issue(("binding", id(binding)), resolve, alive=alive, pin=run_pin(turn.run))


def mcp_servers_for(mcp: McpSurface) -> Callable[[Turn, RuntimePolicy], list[dict[str, Any]]]:
    """What `Turn.mcp_servers(policy)` calls: the gateway's MCP server entries for a turn's agent."""

    def provide(turn: Turn, policy: RuntimePolicy, base_url: str | None = None) -> list[dict[str, Any]]:
        """``base_url``: where the agent reaches the gateway from inside its sandbox (default: the
        gateway's own URL)."""
        if not mcp.tools.tools:
            return []
        base_url = base_url or mcp.base_url
        if base_url is None:
            log.warning("the gateway's own URL is not known: the agent gets no gateway MCP server")
            return []
        token = binding_lease(mcp, turn)
        if policy.mcp_http:
            return [http_entry(base_url, token)]
        return [stdio_entry(base_url, token)]

    return provide
