"""Identity family: who is calling (``authenticate``) and what they may do (``authorize``)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from aiohttp import web

    from agent_gateway.auth import Actor
    from agent_gateway.config import Config


@hookspec(firstresult=True)
def authenticate(request: web.Request, config: Config) -> Actor | Awaitable[Actor | None] | None:
    """Say who sent ``request`` (an :class:`aiohttp.web.Request`): return an
    :class:`agent_gateway.Actor` (its ``id`` and ``claims``: ``roles``, ``workspaces``, anything
    else), or None to leave the request to another plugin. ``config`` is the loaded
    :class:`agent_gateway.Config`. :func:`agent_gateway.bearer_token` reads the
    ``Authorization: Bearer`` header.

    Return an awaitable (an ``async def`` helper's coroutine) when the answer needs I/O: it is
    awaited, and it answers for the request — resolving to None means nobody vouches for it
    (401), later plugins are not asked. Raise :class:`agent_gateway.ApiError` 401 to refuse a
    credential that is yours but invalid with a reason (an expired JWT), rather than None.

    First non-None result wins; the built-in ``[auth] tokens`` lookup is ``trylast``. Called for
    every request except the public paths (``/v1/health``, ``/openapi.json``, the console's files,
    the MCP endpoint, which takes run-scoped lease tokens). Keep it cheap: it runs on the event
    loop. Whether authentication is required at all is :func:`authentication_enabled`.
    """


@hookspec
def authentication_enabled(config: Config) -> bool | None:
    """Say whether this plugin's ``authenticate`` is in use with ``config`` (True), or not (False:
    a plugin that is switched off in its configuration section).

    When no plugin says True, the gateway runs with one local actor and no authentication, as it
    does with no ``[auth] tokens`` (listening on loopback only). A plugin implementing
    ``authenticate`` without this hook counts as always in use. The built-in answers True when
    ``[auth] tokens`` are configured. Raise :class:`agent_gateway.PluginError` with a one-line
    reason when the configuration cannot be served (an unreadable key file). All implementations
    are called, once at start-up (and by ``agent-gateway serve`` to decide whether it may listen
    beyond loopback).
    """


@hookspec
def authorize(actor: Actor, action: str, resource: dict[str, Any]) -> bool | Awaitable[bool | None] | None:
    """Decide whether ``actor`` (an :class:`agent_gateway.Actor`) may do ``action`` on
    ``resource``: True allows, False denies, None abstains. Return an awaitable for an answer
    that needs I/O.

    ``action`` is one of ``runs:create``, ``runs:read``, ``runs:cancel``, ``runs:permission``,
    ``sessions:read``, ``sessions:write``, ``sessions:delete``, ``workspaces:read``,
    ``agents:read``, ``tools:call``, ``preferences:read``, ``preferences:write``,
    ``metrics:read`` or ``routes:call`` (a plugin route: the OpenAI-compatible and AG-UI endpoints
    among them). ``resource`` is a dict with a ``type`` (``run``, ``session``, ``workspace``,
    ``agent``, ``tool``, ``preferences``, ``metrics``, ``route``) and what the gateway knows of it
    (ids, the run's ``agentId``/``sessionId``/``workspaceId``, a route's
    ``method``/``path``/``params``); see docs/auth.md for the full table.

    All implementations are called; any False denies (403 ``forbidden``), and with no False
    the action is allowed. With no implementation at all the gateway skips the call. Tool calls
    agents make (over MCP, with a lease of their run, or ACP file methods) are asked
    ``tools:call`` for the run's actor; a denied call fails with the tool error ``forbidden``.
    """
