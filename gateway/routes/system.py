"""/v1/health and /openapi.json."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from agent_gateway.errors import ApiError
from agent_gateway.routes import sessions

if TYPE_CHECKING:
    from agent_gateway.app import Gateway

OPENAPI_PATH = Path(__file__).resolve().parent.parent / "openapi.json"
# How long readiness waits for the storage ping before reporting storage as down.
HEALTH_PING_TIMEOUT_S = 3.0

log = logging.getLogger("agent_gateway.health")


def setup(app: web.Application, gateway: Gateway, plugin_paths: Mapping[str, Mapping[str, Any]]) -> None:
    """``plugin_paths``: the OpenAPI path items plugins declare with their routes (a live,
    read-only view: plugins add routes after the core's)."""
    spec = json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))
    # The sessions API keeps its OpenAPI block in its own module.
    spec["paths"] = {**spec["paths"], **sessions.OPENAPI_PATHS}
    spec["components"]["schemas"] = {**spec["components"]["schemas"], **sessions.OPENAPI_SCHEMAS}

    # One storage ping at a time: concurrent probes share it, so a hung database holds one worker.
    ping_in_flight: asyncio.Future[None] | None = None

    async def storage_up() -> bool:
        nonlocal ping_in_flight
        ping = getattr(gateway.storage, "ping", None)
        if ping is None:  # a storage plugin without ping: nothing to ask
            return True
        if ping_in_flight is None or ping_in_flight.done():
            ping_in_flight = asyncio.get_running_loop().run_in_executor(gateway.executor, ping)
            ping_in_flight.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            async with asyncio.timeout(HEALTH_PING_TIMEOUT_S):
                await asyncio.shield(ping_in_flight)
        except Exception as exc:  # StorageUnavailable, a timeout, or the driver's own error
            log.warning("health: storage is down: %s", str(exc).strip() or type(exc).__name__)
            return False
        return True

    async def health(request: web.Request) -> web.Response:
        """Readiness (the default, or `?probe=ready`): 200 when storage answers, else 503
        `degraded`. Liveness (`?probe=live`): 200 while the process serves HTTP."""
        probe = request.query.get("probe", "ready")
        if probe == "live":
            return web.json_response({"status": "ok", "probe": "live"})
        if probe != "ready":
            raise ApiError(400, "invalid_request", "probe must be 'ready' or 'live'")
        up = await storage_up()
        return web.json_response(
            {
                "status": "ok" if up else "degraded",
                "storage": "up" if up else "down",
                "agents": sorted(gateway.runtimes),
                "activeRuns": len(gateway.runs.active_runs()),
                "journalPending": gateway.journal.pending,
            },
            status=200 if up else 503,
        )

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response({**spec, "paths": {**spec["paths"], **plugin_paths}})

    app.router.add_get("/v1/health", health)
    app.router.add_get("/openapi.json", openapi)
