"""``POST /v1/pi-lab/runs/{hostRunId}/steer`` and ``.../follow-up``: ``{"message": "..."}``.

Served through the ``register_routes`` hook (:class:`agent_gateway.PluginRoutes`), each route
declared with its OpenAPI operation from this folder's ``openapi.json``. 202 with Pi's disposition when
the message was queued into the running turn; 409 when the run is not running on Pi.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from agent_gateway import ApiError, PluginRoutes, read_json

from .rpc import PiError
from .runtime import AGENT_ID, PiRuntime

# As /openapi.json says: a message holds a character no regex dialect counts as white space.
VISIBLE = re.compile(r"[^\s\u001c-\u001f\u0085\ufeff]")
OPENAPI_PATHS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "openapi.json").read_text(encoding="utf-8")
)["paths"]


def setup(routes: PluginRoutes) -> None:
    async def queue(request: web.Request, command: str) -> web.Response:
        runtime = routes.runtime(AGENT_ID)
        if not isinstance(runtime, PiRuntime):
            raise ApiError(404, "unknown_agent", "pi-lab is not enabled")
        host_run_id = request.match_info["hostRunId"]
        run = await routes.run(host_run_id, routes.actor(request))
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        body = await read_json(request)
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not VISIBLE.search(message) or set(body) != {"message"}:
            raise ApiError(400, "invalid_request", 'send {"message": "<a non-blank text>"}')
        try:
            data = await (runtime.steer if command == "steer" else runtime.follow_up)(host_run_id, message)
        except LookupError as exc:
            raise ApiError(409, "run_not_running", str(exc)) from exc
        except PiError as exc:
            raise ApiError(409, "pi_refused", str(exc)) from exc
        return web.json_response({"hostRunId": host_run_id, "command": command, **data}, status=202)

    async def steer(request: web.Request) -> web.Response:
        return await queue(request, "steer")

    async def follow_up(request: web.Request) -> web.Response:
        return await queue(request, "follow_up")

    for path, handler in (
        ("/v1/pi-lab/runs/{hostRunId}/steer", steer),
        ("/v1/pi-lab/runs/{hostRunId}/follow-up", follow_up),
    ):
        routes.add("POST", path, handler, openapi=OPENAPI_PATHS[path]["post"])
