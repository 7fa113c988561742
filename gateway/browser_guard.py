"""Keep browser pages from driving a gateway they can reach (DNS rebinding, cross-site requests).

A page on any site can send requests to ``127.0.0.1``; after DNS rebinding its own host name
resolves there and the page is same-origin. So, in order:

1. With no tokens (the loopback, single-actor mode) only loopback ``Host`` values are served
   (``127.0.0.1``, ``localhost``, ``[::1]``, any port) plus ``[gateway] allowed_hosts``: a
   rebound name is refused before anything else runs.
2. A state-changing request (POST, PUT, PATCH, DELETE) whose ``Origin`` is neither the
   gateway's own origin nor one of ``[gateway] cors_origins`` is refused.
3. With no tokens, a state-changing request without a body must carry ``Content-Type:
   application/json`` or an ``X-Agent-Gateway-Client`` header (one with a body must be JSON
   anyway). A page can send neither across sites without a CORS preflight, so a plain form post
   or a body-less ``fetch`` cannot cancel a run.

CORS is off unless ``[gateway] cors_origins`` lists an origin; for those, preflights are answered
and responses carry ``Access-Control-Allow-Origin``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from aiohttp import web

from agent_gateway.errors import ApiError
from agent_gateway.mcp import MCP_PATH

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
CLIENT_HEADER = "X-Agent-Gateway-Client"
CORS_ALLOWED_HEADERS = ("Authorization", "Content-Type", "Last-Event-ID", CLIENT_HEADER, "Mcp-Session-Id")
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
CORS_MAX_AGE = "600"
# Paths that always need a run-scoped lease token (never a cookie or ambient credential), so a
# page cannot forge a request there anyway; their own 401 is the better answer to a bare call.
LEASE_AUTHENTICATED_PATHS = frozenset({MCP_PATH})


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:8787`` → ``::1``, ``Localhost:80`` → ``localhost``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_name(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class BrowserGuard:
    def __init__(self, tokens_configured: bool, allowed_hosts: list[str], cors_origins: list[str]) -> None:
        self.check_host = not tokens_configured
        self.require_client_signal = not tokens_configured
        self.allowed_hosts = {name.lower() for name in allowed_hosts}
        self.cors_origins = {origin.rstrip("/").lower() for origin in cors_origins}

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.check_host:
            return True
        if not host_header:
            return False
        name = host_name(host_header)
        return is_loopback_name(name) or name in self.allowed_hosts

    def origin_allowed(self, request: web.Request, origin: str) -> bool:
        origin = origin.rstrip("/").lower()
        own = f"{request.scheme}://{request.host}".lower()
        return origin == own or origin in self.cors_origins

    def check(self, request: web.Request) -> web.Response | None:
        """Before the route handler (the gateway's middleware calls it): raises
        :class:`ApiError` 403 for a request the guard refuses; a CORS preflight's answer; None
        to let the request through."""
        if not self.host_allowed(request.headers.get("Host")):
            raise ApiError(
                403,
                "host_not_allowed",
                "this gateway serves loopback Host names only (add others to [gateway] allowed_hosts)",
            )
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers:
            return self.preflight(origin)
        # (an unknown route or method gets its own 404/405 below)
        if request.method in STATE_CHANGING and request.match_info.http_exception is None:
            if origin is not None and not self.origin_allowed(request, origin):
                raise ApiError(403, "origin_not_allowed", f"requests from origin {origin[:200]!r} are refused")
            # A request with a body is refused by the route unless the body is JSON (415).
            bodyless = not request.body_exists
            if (
                self.require_client_signal
                and request.path not in LEASE_AUTHENTICATED_PATHS
                and bodyless
                and request.content_type != "application/json"
                and CLIENT_HEADER not in request.headers
            ):
                raise ApiError(
                    403,
                    "client_signal_required",
                    f"a request without a body needs Content-Type: application/json or an {CLIENT_HEADER} header",
                )
        return None

    def preflight(self, origin: str) -> web.Response:
        if origin.rstrip("/").lower() not in self.cors_origins:
            raise ApiError(403, "origin_not_allowed", f"CORS is not enabled for origin {origin[:200]!r}")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": CORS_METHODS,
                "Access-Control-Allow-Headers": ", ".join(CORS_ALLOWED_HEADERS),
                "Access-Control-Max-Age": CORS_MAX_AGE,
                "Vary": "Origin",
            },
        )

    async def add_cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare``: streamed responses get their CORS headers too."""
        origin = request.headers.get("Origin")
        if origin and origin.rstrip("/").lower() in self.cors_origins:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers.add("Vary", "Origin")


def guard_from_config(tokens_configured: bool, gateway_section: dict[str, Any]) -> BrowserGuard:
    return BrowserGuard(
        tokens_configured, list(gateway_section["allowed_hosts"]), list(gateway_section["cors_origins"])
    )
