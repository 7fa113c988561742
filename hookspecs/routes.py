"""HTTP surface family: routes a plugin serves next to the core's."""

from __future__ import annotations

from typing import Any

from agent_gateway.hookspecs import hookspec


@hookspec
def register_routes(app: Any, gateway: Any) -> None:
    """Add HTTP routes for a plugin (for example the knowledge plugin's ``/v1/knowledge/...``).

    ``app`` is the :class:`aiohttp.web.Application` (not started yet: add routes with
    ``app.router.add_get`` / ``add_post`` ...); ``gateway`` is the :class:`gateway.app.Gateway`
    (``gateway.tools``, ``gateway.storage``, ``gateway.executor``, ``gateway.config``).
    Requests are authenticated before they reach a plugin route: ``request["actor"]`` is the
    calling actor. Errors should be raised as :class:`gateway.errors.ApiError` so clients get
    the gateway's JSON error shape. Keep plugin routes under ``/v1/<plugin area>/``; a path the
    core or another plugin already serves is an error at start-up. Called once by
    ``create_app``, after the core routes. All implementations are called.
    """
