"""The pluggy markers of the ``agent_gateway`` project (no imports of the hook modules, so each of
them can import the markers without an import cycle)."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "agent_gateway"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
