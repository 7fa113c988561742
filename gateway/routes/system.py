"""/v1/health and /openapi.json."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent_gateway.routes import sessions

if TYPE_CHECKING:
    from agent_gateway.app import Gateway

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "openapi.json"


def setup(app: web.Application, gateway: Gateway, plugin_paths: Mapping[str, Mapping[str, Any]]) -> None:
    """``plugin_paths``: the OpenAPI path items plugins declare with their routes (a live,
    read-only view: plugins add routes after the core's)."""
    spec = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    # The sessions API keeps its OpenAPI block in its own module.
    spec["paths"] = {**spec["paths"], **sessions.OPENAPI_PATHS}
    spec["components"]["schemas"] = {**spec["components"]["schemas"], **sessions.OPENAPI_SCHEMAS}

    async def health(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "agents": sorted(gateway.runtimes),
                "activeRuns": len(gateway.runs.active_runs()),
                "journalPending": gateway.journal.pending,
            }
        )

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response({**spec, "paths": {**spec["paths"], **plugin_paths}})

    app.router.add_get("/v1/health", health)
    app.router.add_get("/openapi.json", openapi)
