"""GET/PUT /v1/preferences: the calling actor's own preferences (see agent_gateway.preferences)."""

from __future__ import annotations

from aiohttp import web

from agent_gateway.auth import ACTOR_ID, Auth
from agent_gateway.errors import ApiError, read_json
from agent_gateway.preferences import Preferences


def setup(app: web.Application, auth: Auth, preferences: Preferences) -> None:
    async def read(request: web.Request) -> web.Response:
        if auth.authorizing:
            await auth.authorize(request, "preferences:read", {"type": "preferences", "id": request[ACTOR_ID]})
        return web.json_response(await preferences.get(request[ACTOR_ID]))

    async def write(request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"values"} or "values" not in body:
            raise ApiError(400, "invalid_request", 'send {"values": {"<preference key>": value or null, ...}}')
        if auth.authorizing:
            await auth.authorize(request, "preferences:write", {"type": "preferences", "id": request[ACTOR_ID]})
        return web.json_response(await preferences.put(request[ACTOR_ID], body["values"]))

    app.router.add_get("/v1/preferences", read)
    app.router.add_put("/v1/preferences", write)
