"""The pluggy contract of Agent Gateway.

Plugins implement these hooks with ``@hookimpl`` (``from agent_gateway import hookimpl``) and are
registered through the ``agent_gateway`` entry-point group. One module per hook family; each hook
says what it is for, its arguments (typed with the public names of ``agent_gateway``), whether the
first non-None result wins, and when the core calls it.
"""

from __future__ import annotations

from agent_gateway.hookspecs import (
    auth,
    cluster,
    config,
    descriptors,
    projection,
    routes,
    runtime,
    session,
    storage,
    telemetry,
    tools,
)
from agent_gateway.hookspecs.markers import PROJECT_NAME, hookimpl, hookspec

SPEC_MODULES = (runtime, session, tools, storage, projection, config, routes, descriptors, cluster, auth, telemetry)

__all__ = ["PROJECT_NAME", "SPEC_MODULES", "hookimpl", "hookspec"]
