"""AG-UI plugin (entry point ``ag_ui``): the gateway's runs spoken in the AG-UI protocol.

``POST /v1/ag-ui/{agentId}`` takes an AG-UI ``RunAgentInput`` and answers with the run's AG-UI
event stream; ``GET /v1/ag-ui/runs/{runId}/stream`` resumes it after ``Last-Event-ID``. The events
are built with the official ``ag_ui`` models and encoder (PyPI ``ag-ui-protocol``, the
``agent-gateway[ag-ui]`` extra): without it the plugin logs why and serves no routes. See
docs/ag-ui.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent_gateway import hookimpl

if TYPE_CHECKING:
    from agent_gateway import PluginRoutes

log = logging.getLogger(__name__)
MISSING = (
    "the AG-UI routes (/v1/ag-ui/...) are off: the `ag_ui` package is not installed "
    "(pip install 'agent-gateway[ag-ui]', which brings ag-ui-protocol)"
)


@hookimpl
def register_routes(routes: PluginRoutes) -> None:
    try:
        from .routes import setup
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith(("ag_ui", "pydantic")):
            raise
        log.info(MISSING)  # an optional extra, not a fault: the default install has no AG-UI
        return
    setup(routes)
