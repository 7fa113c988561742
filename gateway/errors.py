"""JSON errors: every refusal is `{"error": {"code", "message", ...}}` with a 4xx status (503
`storage_unavailable` while the database is unreachable, `agent_unavailable` for an agent that
cannot run here)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from agent_gateway.storage import StorageUnavailable

log = logging.getLogger("agent_gateway.http")
# Seconds a client is told to wait (Retry-After) when the database is unreachable.
STORAGE_RETRY_AFTER_S = 5


class PluginError(Exception):
    """A plugin could not be loaded or broke the contract."""


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.extra = extra
        # Response headers sent with the error (e.g. ``x-should-retry: false``).
        self.headers: dict[str, str] = {}


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


# A plugin route's own error body: (status, code, message, extra) -> the JSON object sent.
ErrorShape = Callable[[int, str, str, dict[str, Any]], dict[str, Any]]
# Per route path (the aiohttp resource's canonical path), the shape its errors take; set by
# PluginRoutes.add(error_shape=...) so a protocol's clients get that protocol's error bodies,
# also for refusals that happen before the handler (authentication, body size, browser guard).
ERROR_SHAPES = web.AppKey("error_shapes", dict[str, ErrorShape])


def _shaped_error(request: web.Request, status: int, code: str, message: str, **extra: Any) -> web.Response:
    shapes = request.config_dict.get(ERROR_SHAPES)
    resource = request.match_info.route.resource if shapes else None
    shape = shapes.get(resource.canonical) if shapes and resource is not None else None
    if shape is None:
        return error_response(status, code, message, **extra)
    return web.Response(
        status=status, body=orjson.dumps(shape(status, code, message, extra)), content_type="application/json"
    )


def json_error(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The JSON error response for `exc`, raised while handling `request` (in the shape of the
    route's plugin, if it has one). An HTTP exception below 400 (a redirect) is raised again.
    Called by the gateway's one middleware (`agent_gateway.app.gateway_middleware`)."""
    if isinstance(exc, ApiError):
        response = _shaped_error(request, exc.status, exc.code, str(exc), **exc.extra)
        # When to retry: run admission's 429 (AdmissionRefused), or any refusal that says so in
        # its body (one another cluster instance made and this one relays).
        retry_after = getattr(exc, "retry_after", exc.extra.get("retryAfterSeconds"))
        if isinstance(retry_after, int) and not isinstance(retry_after, bool):
            response.headers["Retry-After"] = str(retry_after)
        response.headers.update(getattr(exc, "headers", None) or {})
        return response
    if isinstance(exc, StorageUnavailable):  # the database is down: say so, without a traceback per request
        log.warning("storage unavailable on %s %s: %s", request.method, request.path, exc)
        response = _shaped_error(
            request, 503, "storage_unavailable", "the gateway's database is unreachable; retry later"
        )
        response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER_S)
        return response
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        message = exc.reason
        if exc.status == 413:
            message = "the request body exceeds the gateway's max_body_bytes limit"
        response = _shaped_error(request, exc.status, _HTTP_CODES.get(exc.status, "http_error"), message)
        if "Allow" in exc.headers:  # a 405 says which methods the path takes
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return _shaped_error(request, 500, "internal_error", "internal error; see the gateway log")


# Request bodies nest a few levels (run context, tool arguments); anything deeper is refused
# before it reaches code that walks it recursively.
MAX_JSON_DEPTH = 64


class JsonBodyError(ValueError):
    """A body that is not acceptable JSON; ``code`` and ``field`` say why and where."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


def parse_json_body(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a request body: valid UTF-8 JSON, nested at most ``max_depth`` levels, and no text
    (key or value) holding a NUL or a lone surrogate, which some storage backends refuse and
    others store. Raises :class:`JsonBodyError` naming the offending field."""
    try:
        value = orjson.loads(raw)  # C parser: bounded depth, no recursion in Python
    except orjson.JSONDecodeError as exc:
        if "surrogate" not in str(exc):
            if "depth" in str(exc) or "recursion" in str(exc):
                raise JsonBodyError("json_too_deep", f"the JSON nests deeper than {max_depth} levels") from None
            raise JsonBodyError("invalid_json", f"malformed JSON: {exc}") from None
        # orjson refuses lone surrogates without saying where; parse again to name the field
        try:
            value = json.loads(raw)
        except RecursionError:
            raise JsonBodyError("json_too_deep", f"the JSON nests deeper than {max_depth} levels") from None
        except ValueError as again:
            raise JsonBodyError("invalid_json", f"malformed JSON: {again}") from None
    check_json_text(value, max_depth)
    return value


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate"
    return None


def check_json_text(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Walk ``value`` without recursion: depth within ``max_depth``, every string clean."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = _bad_text(item)
            if problem:
                raise JsonBodyError("invalid_text", f"{path or 'the body'} holds {problem}", path or None)
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise JsonBodyError("json_too_deep", f"the JSON nests deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    child_path = f"{path}.{key}" if path else str(key)
                    problem = _bad_text(key)
                    if problem:
                        where = f"a key in {path}" if path else "a top-level key"
                        raise JsonBodyError("invalid_text", f"{where} holds {problem}", path or None)
                    stack.append((child, child_path, depth + 1))
            else:
                stack.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item))


async def read_json(request: web.Request) -> Any:
    """The request's JSON body, checked by :func:`parse_json_body`; a 4xx :class:`ApiError` otherwise."""
    if request.content_type not in ("application/json", ""):
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    raw = await request.read()
    if not raw:
        raise ApiError(400, "invalid_json", "the body is empty; expected a JSON object")
    try:
        return parse_json_body(raw)
    except JsonBodyError as exc:
        extra = {"field": exc.field} if exc.field else {}
        raise ApiError(400, exc.code, str(exc), **extra) from None
