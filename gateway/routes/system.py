"""/v1/health and /openapi.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from agent_gateway.app import Gateway

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "openapi.json"


def setup(app: web.Application, gateway: Gateway) -> None:
    spec = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))

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
        # Plugins that add routes (register_routes) describe them in gateway.openapi_paths.
        return web.json_response({**spec, "paths": {**spec["paths"], **gateway.openapi_paths}})

    app.router.add_get("/v1/health", health)
    app.router.add_get("/openapi.json", openapi)
