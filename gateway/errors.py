"""JSON errors: every refusal is `{"error": {"code", "message", ...}}` with a 4xx status (503
`storage_unavailable` while the database is unreachable)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from agent_gateway.storage import StorageUnavailable

log = logging.getLogger("agent_gateway.http")
# Seconds a client is told to wait (Retry-After) when the database is unreachable.
STORAGE_RETRY_AFTER_S = 5


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.extra = extra


def error_response(status: int, code: str, message: str, **extra: Any) -> web.Response:
    body = {"error": {"code": code, "message": message, **extra}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
}


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, str(exc), **exc.extra)
    except StorageUnavailable as exc:  # the database is down: say so, without a traceback per request
        log.warning("storage unavailable on %s %s: %s", request.method, request.path, exc)
        response = error_response(503, "storage_unavailable", "the gateway's database is unreachable; retry later")
        response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER_S)
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason
        if exc.status == 413:
            message = "the request body exceeds the gateway's max_body_bytes limit"
        return error_response(exc.status, _HTTP_CODES.get(exc.status, "http_error"), message)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal error; see the gateway log")


async def read_json(request: web.Request) -> Any:
    if request.content_type not in ("application/json", ""):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    raw = await request.read()
    if not raw:
        raise ApiError(400, "invalid_json", "the body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"malformed JSON: {exc}") from exc
