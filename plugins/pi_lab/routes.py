"""``POST /v1/pi-lab/runs/{hostRunId}/steer`` and ``.../follow-up``: ``{"message": "..."}``.

Served through the ``register_routes`` hook (:class:`agent_gateway.PluginRoutes`), each route
declared once as an :class:`agent_gateway.Route`: its body is validated, and ``/openapi.json``
describes it, from the models below. 202 with Pi's disposition when the message was queued into
the running turn; 409 when the run is not running on Pi.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from agent_gateway import ApiError, NonBlankText, PluginRoutes, Route, RouteResponse

from .rpc import PiError
from .runtime import AGENT_ID, PiRuntime

Command = Literal["steer", "follow_up"]
ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


class PiLabMessage(BaseModel):
    """What to send into the run's in-flight Pi turn."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    message: NonBlankText


class PiLabRunPath(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    hostRunId: str = Field(min_length=1)


class PiLabQueued(BaseModel):
    """Queued: the run, the command, and Pi's answer to it (its disposition, ...)."""

    model_config = ConfigDict(extra="allow", defer_build=True)
    hostRunId: str
    command: Command


def _declare(path: str, what: str) -> Route[PiLabMessage, Any, PiLabRunPath]:
    return Route(
        "POST",
        path,
        f"Pi-lab: send a {what} message into the run's in-flight Pi turn (pi_lab plugin)",
        tags=("pi-lab (plugin)",),
        body=PiLabMessage,
        params=PiLabRunPath,
        responses={
            202: RouteResponse("Queued into the running turn", PiLabQueued),
            404: RouteResponse("No such run, or pi-lab is not enabled", content=ERROR_BODY),
            409: RouteResponse("The run is not running on Pi, or Pi refused", content=ERROR_BODY),
        },
        errors=(400, 401, 403, 413, 415, 503),
    )


STEER = _declare("/v1/pi-lab/runs/{hostRunId}/steer", "steer")
FOLLOW_UP = _declare("/v1/pi-lab/runs/{hostRunId}/follow-up", "follow-up")


def setup(routes: PluginRoutes) -> None:
    async def queue(
        request: web.Request, route: Route[PiLabMessage, Any, PiLabRunPath], command: Command
    ) -> web.Response:
        runtime = routes.runtime(AGENT_ID)
        if not isinstance(runtime, PiRuntime):
            raise ApiError(404, "unknown_agent", "pi-lab is not enabled")
        host_run_id = route.parse_path(request).hostRunId
        run = await routes.run(host_run_id, routes.actor(request))
        if run is None:
            raise ApiError(404, "run_not_found", "no such run")
        message = (await route.read_body(request)).message  # (after the run: another's is a 404)
        try:
            data = await (runtime.steer if command == "steer" else runtime.follow_up)(host_run_id, message)
        except LookupError as exc:
            raise ApiError(409, "run_not_running", str(exc)) from exc
        except PiError as exc:
            raise ApiError(409, "pi_refused", str(exc)) from exc
        return web.json_response({"hostRunId": host_run_id, "command": command, **data}, status=202)

    async def steer(request: web.Request) -> web.Response:
        return await queue(request, STEER, "steer")

    async def follow_up(request: web.Request) -> web.Response:
        return await queue(request, FOLLOW_UP, "follow_up")

    routes.add(STEER, steer)
    routes.add(FOLLOW_UP, follow_up)
