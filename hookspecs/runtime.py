"""Runtime policy family: the agent runtimes a plugin provides."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.runtime import Runtime, RuntimePolicy
    from agent_gateway.sandbox import AgentLaunch, SandboxedCommand, SandboxUnavailable


@hookspec
def register_runtimes(register: Callable[[Runtime], None], config: Config) -> None:
    """Register agent runtimes.

    Call ``register(runtime)`` once per runtime; ``runtime`` follows the
    :class:`agent_gateway.Runtime` protocol (an ``agent_id``, a ``policy``, ``describe()`` and
    ``run_turn(turn)``). ``config`` is the loaded :class:`agent_gateway.Config`; read your own
    section with ``config.section("<name>")``. An agent id registered twice is a start-up error.

    Called once when the app is created, before it starts listening.
    """


@hookspec
def negotiate_runtime_policy(agent_id: str, policy: RuntimePolicy, initialize_result: dict[str, Any]) -> None:
    """Adjust a runtime's policy after its agent answered ``initialize``.

    ``policy`` is the :class:`agent_gateway.RuntimePolicy` already merged from the plugin's
    defaults and the agent's declared capabilities; change its attributes in place.
    ``initialize_result`` is the agent's raw answer. All implementations are called.

    Called each time a runtime process is (re)initialised.
    """


@hookspec(firstresult=True)
def sandbox_agent(launch: AgentLaunch) -> SandboxedCommand | SandboxUnavailable | Awaitable[Any] | None:
    """Confine an agent process: turn ``launch`` (an :class:`agent_gateway.AgentLaunch`: command,
    environment, working directory, the actor, the workspace folder and the allowed roots the run
    may write, the agent's per-actor home, what it must read, the ``(host, port)`` endpoints it may
    reach and the gateway's MCP URL) into the command that actually starts it.

    Return an :class:`agent_gateway.SandboxedCommand` (argv, environment, cwd, a one-line
    description of the confinement, optionally the MCP base URL the agent uses inside and a
    cleanup), or an awaitable of one; an :class:`agent_gateway.SandboxUnavailable` with a one-line
    reason when this plugin cannot confine agents here; or None to leave it to another plugin.
    ``launch.open_egress(endpoints)`` opens the gateway's allow-listing CONNECT proxy on a Unix
    socket for this sandbox (its ``directory`` holds ``egress.sock``); ``launch.mcp_socket`` is
    the gateway's MCP-only Unix socket.

    First non-None result wins; the built-in bubblewrap sandbox is ``trylast``. What happens when
    nothing confines an agent is ``[sandbox] mode``: ``required`` refuses to start it, ``auto``
    warns once and starts it unconfined. Called before every agent process start (never with
    ``[sandbox] mode = "off"``).
    """
