"""Session strategy family: how a run finds its agent session."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.runtime import Runtime
    from agent_gateway.sessions import SessionStrategy


@hookspec(firstresult=True)
def session_strategy(runtime: Runtime, config: Config) -> SessionStrategy | None:
    """Return the session strategy for ``runtime``, or None to leave it to another plugin.

    A strategy decides, for each run, whether to reuse a live binding (``native_live``), load
    the agent's session (``loaded``), or start a new one with a cold-resume packet
    (``cold_resumed`` / ``new_session``); see :class:`agent_gateway.SessionStrategy`.
    First non-None result wins; the built-in default is ``trylast``.

    A runtime that brings its own strategy needs no implementation of this hook: it sets a
    ``session_strategy`` attribute (an object with ``async plan(turn, runtime)``) and the built-in
    default returns it; runtimes without one get the gateway-transcript strategy. Implement the
    hook only to choose a strategy for runtimes you do not own (it wins over both).

    Called once per runtime when the app is created.
    """
