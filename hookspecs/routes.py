"""HTTP surface family: routes a plugin serves next to the core's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.plugin_routes import PluginRoutes


@hookspec
def register_routes(routes: PluginRoutes) -> None:
    """Serve HTTP routes for a plugin (for example the knowledge plugin's ``/v1/knowledge/...``).

    ``routes`` is an :class:`agent_gateway.PluginRoutes`, the plugin's only door to the gateway:
    declare each route with its OpenAPI operation, ``routes.add("GET", "/v1/<area>/...", handler,
    openapi={...})``, and read through it in handlers (``routes.actor(request)``,
    ``routes.preferences(actor)``, ``routes.run(id, actor)``, ``routes.runtime(agent_id)``,
    ``routes.tool(name)`` / ``routes.call_tool(...)``, ``routes.config``, ``routes.in_thread(...)``);
    ``routes.on_shutdown(callback)`` releases what the routes hold. Requests are authenticated
    before they reach a plugin route. Raise :class:`agent_gateway.ApiError` so clients get the
    gateway's JSON error shape. Routes live under ``/v1/<plugin area>/``; a path the core or
    another plugin already serves is a :class:`agent_gateway.PluginError` at start-up. Called
    once by ``create_app``, after the core routes. All implementations are called.
    """
