"""The pluggy contract of Agent Gateway.

Plugins implement these hooks with `@hookimpl` and are registered through the `agent_gateway`
entry-point group. One module per hook family; each hook says what it is for, its arguments,
whether the first non-None result wins, and when the core calls it.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "agent_gateway"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

from agent_gateway.hookspecs import (  # noqa: E402  (the markers above must exist first)
    config,
    descriptors,
    projection,
    routes,
    runtime,
    session,
    storage,
    tools,
)

SPEC_MODULES = (runtime, session, tools, storage, projection, config, routes, descriptors)

__all__ = ["PROJECT_NAME", "SPEC_MODULES", "hookimpl", "hookspec"]
