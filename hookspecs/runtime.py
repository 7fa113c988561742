"""Runtime policy family: the agent runtimes a plugin provides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.runtime import Runtime, RuntimePolicy


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
