"""AG-UI plugin (entry point ``ag_ui``): the gateway's runs spoken in the AG-UI protocol.

``POST /v1/ag-ui/{agentId}`` takes an AG-UI ``RunAgentInput`` and answers with the run's AG-UI
event stream; ``GET /v1/ag-ui/runs/{runId}/stream`` resumes it after ``Last-Event-ID``. The events
are built with the official ``ag_ui`` models and encoder (PyPI ``ag-ui-protocol``, the
``agent-gateway[ag-ui]`` extra): without it the plugin logs why and serves no routes. See
docs/ag-ui.md.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway import hookimpl

if TYPE_CHECKING:
    from agent_gateway import PluginRoutes

log = logging.getLogger(__name__)
MISSING = (
    "the AG-UI routes (/v1/ag-ui/...) are off: the `ag_ui` package is not installed "
    "(pip install 'agent-gateway[ag-ui]', which brings ag-ui-protocol)"
)


SECTION = "ag_ui"
CLIENT_TOOLS_CHOICES = ("reject", "ignore")
# client_tools: what an input with `tools` for an agent that cannot take them gets: a 400
# `tools_not_supported`, or a run without them (RUN_STARTED's metadata says what it ignored).
DEFAULTS: dict[str, Any] = {"client_tools": "reject"}


def _validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    if section["client_tools"] not in CLIENT_TOOLS_CHOICES:
        return [("client_tools", f"must be one of {', '.join(repr(c) for c in CLIENT_TOOLS_CHOICES)}")]
    return []


@hookimpl
def config_sections(register: Callable[..., None]) -> None:
    register(SECTION, DEFAULTS, _validate, "AG-UI endpoints (/v1/ag-ui/...).")


@hookimpl
def register_routes(routes: PluginRoutes) -> None:
    # (the SDK itself is imported when a stream is first encoded: its models cost start-up time)
    if importlib.util.find_spec("ag_ui") is None:
        log.info(MISSING)  # an optional extra, not a fault: the default install has no AG-UI
        return
    from .routes import setup

    setup(routes, routes.config.section(SECTION)["client_tools"])
