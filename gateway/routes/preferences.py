"""GET/PUT /v1/preferences: the calling actor's own preferences (see agent_gateway.preferences)."""

from __future__ import annotations

from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, model_validator

from agent_gateway import api_models
from agent_gateway.auth import ACTOR_ID, Auth
from agent_gateway.declare import Route, RouteResponse, component, refuse
from agent_gateway.preferences import Preferences


class PreferencesUpdate(BaseModel):
    """Preference values to merge: a value sets its key, null removes it. The served document
    lists this gateway's keys (PreferenceValues); the descriptors' fields check the values."""

    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)
    # (any JSON here: the descriptors' registry checks the values, with its own 400s)
    values: Annotated[Any, component("PreferenceValues")]

    @model_validator(mode="before")
    @classmethod
    def _values_only(cls, body: Any) -> Any:
        if not isinstance(body, dict) or set(body) - {"values"} or "values" not in body:
            raise refuse("invalid_request", 'send {"values": {"<preference key>": value or null, ...}}')
        return body


GET_PREFERENCES: Route[Any, Any] = Route(
    "GET",
    "/v1/preferences",
    "The calling actor's preferences (ai.common.*, ai.agent.<agentId>.*); secrets only as isSet",
    operation_id="getPreferences",
    responses={200: RouteResponse("gateway.preferences.v1", api_models.Preferences)},
    errors=(400, 401, 403, 503),
)
PUT_PREFERENCES: Route[PreferencesUpdate, Any] = Route(
    "PUT",
    "/v1/preferences",
    "Merge preference values ({values: {key: value|null}}), validated against descriptor fields",
    operation_id="putPreferences",
    body=PreferencesUpdate,
    responses={200: RouteResponse("What GET answers now", api_models.Preferences)},
    errors=(400, 401, 403, 413, 415, 503),
)
DECLARED: tuple[Route[Any, Any, Any], ...] = (GET_PREFERENCES, PUT_PREFERENCES)


def setup(app: web.Application, auth: Auth, preferences: Preferences) -> None:
    async def read(request: web.Request) -> web.Response:
        if auth.authorizing:
            await auth.authorize(request, "preferences:read", {"type": "preferences", "id": request[ACTOR_ID]})
        return web.json_response(await preferences.get(request[ACTOR_ID]))

    async def write(request: web.Request) -> web.Response:
        body = await PUT_PREFERENCES.read_body(request)
        if auth.authorizing:
            await auth.authorize(request, "preferences:write", {"type": "preferences", "id": request[ACTOR_ID]})
        return web.json_response(await preferences.put(request[ACTOR_ID], body.values))

    app.router.add_route(GET_PREFERENCES.method, GET_PREFERENCES.path, read)
    app.router.add_route(PUT_PREFERENCES.method, PUT_PREFERENCES.path, write)
