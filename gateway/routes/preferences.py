"""GET/PUT /v1/preferences: the calling actor's own preferences (see gateway/preferences.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from agent_gateway.errors import ApiError, read_json
from agent_gateway.preferences import get_preferences, put_preferences

if TYPE_CHECKING:
    from agent_gateway.app import Gateway


def setup(app: web.Application, gateway: Gateway) -> None:
    async def read(request: web.Request) -> web.Response:
        if gateway.auth.authorizing:
            await gateway.auth.authorize(request, "preferences:read", {"type": "preferences", "id": request["actor"]})
        return web.json_response(await get_preferences(gateway, request["actor"]))

    async def write(request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"values"} or "values" not in body:
            raise ApiError(400, "invalid_request", 'send {"values": {"<preference key>": value or null, ...}}')
        if gateway.auth.authorizing:
            await gateway.auth.authorize(request, "preferences:write", {"type": "preferences", "id": request["actor"]})
        return web.json_response(await put_preferences(gateway, request["actor"], body["values"]))

    app.router.add_get("/v1/preferences", read)
    app.router.add_put("/v1/preferences", write)
