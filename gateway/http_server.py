"""The HTTP server the launcher runs: aiohttp's, with errors from its own parser in the gateway's
JSON shape.

A malformed request (a 100 KB path, an over-long header line, a bad method) never reaches the
application's middlewares: aiohttp's protocol handler answers it itself, as ``text/plain``. The
request handler here answers ``{"error": {"code", "message"}}`` instead, so every refusal a
client can get is JSON.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from agent_gateway.errors import error_response


class JsonErrorRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        text = super().handle_error(request, status, exc, message)  # logs, checks nothing was sent
        del text
        if status >= 500:
            response = error_response(status, "internal_error", "internal error; see the gateway log")
        else:
            reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "bad request"
            detail = (message or reason).splitlines()[0][:200] if (message or reason) else reason
            response = error_response(status, "bad_http_request", f"malformed HTTP request: {detail}")
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser errors as JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = JsonErrorServer  # same state, our request handler per connection
        return server
