"""``/v1/knowledge/...``: the knowledge facade for hosts (the same service the tools use).

Bodies name the workspace (``workspaceId``, default ``"default"``) and may narrow the readable
roots (``allowedRoots``, default the whole workspace directory) used to read files to add or to
locate citations in. Errors use the gateway's JSON error shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web

from agent_gateway import ApiError, PluginRoutes, ToolError, read_json, validate_schema

from .service import KnowledgeService, Where
from .tools import KnowledgeTools

OPENAPI_PATHS: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "openapi.json").read_text(encoding="utf-8")
)["paths"]

HTTP_STATUS = {
    "invalid_arguments": 400,
    "path_refused": 400,
    "not_text": 400,
    "not_a_file": 400,
    "not_a_directory": 400,
    "special_file": 400,
    "outside_roots": 403,
    "no_workspace": 409,
    "not_found": 404,
    "already_exists": 409,
    "too_large": 413,
    "provider_busy": 503,
    "provider_unavailable": 503,
    "provider_error": 502,
}

WHERE_KEYS = ("workspaceId", "allowedRoots")
# A character white space to neither Python (LightRAG strips with it) nor ECMA-262.
VISIBLE = r"[^\s\u001c-\u001f\u0085\ufeff]"
# The workspace path rules a pattern can say (`agent_gateway.paths`), for openapi.json (the route
# checks paths itself, answering `path_refused`): no control character or backslash, no leading
# `~`, no `..` component, and a last component that names something (not empty, not `.`).
# Written without lookahead, one alternative per way a component can start, so Python and
# ECMA-262 read it alike and a generator builds matching strings quickly.
_CHAR = r"[^/\\\u0000-\u001f\u007f]"  # within a component
_NOT_DOT = r"[^/.\\\u0000-\u001f\u007f]"
_NAMED = rf"(?:\.?{_NOT_DOT}{_CHAR}*|\.\.{_CHAR}+)"  # neither empty, `.` nor `..`
_FIRST_NAMED = rf"(?:[^/.~\\\u0000-\u001f\u007f]{_CHAR}*|\.{_NOT_DOT}{_CHAR}*|\.\.{_CHAR}+)"  # no leading `~`
_MIDDLE = rf"(?:{_NAMED}|\.)?"
PATH_PATTERN = rf"^(?:(?:{_FIRST_NAMED}|\.)?(?:/{_MIDDLE})*/{_NAMED}|{_FIRST_NAMED})$"
NAME_PATTERN = rf"^(?:(?:{_FIRST_NAMED}|\.)(?:/{_MIDDLE})*/{_NAMED}|{_FIRST_NAMED})$"  # relative: no leading `/`
ADD_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1, "maxLength": 4096},
        "text": {"type": "string", "minLength": 1, "pattern": VISIBLE},
        "name": {"type": "string", "minLength": 1, "maxLength": 4096},
    },
    "oneOf": [{"required": ["path"]}, {"required": ["text", "name"]}],
    "additionalProperties": False,
}
DELETE_SCHEMA = {
    "type": "object",
    "properties": {
        "documentIds": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 500},
        "sourcePaths": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 500},
    },
    "anyOf": [{"required": ["documentIds"]}, {"required": ["sourcePaths"]}],
    "additionalProperties": False,
}


# No file system the gateway runs on has a longer name, or a longer path with its NUL (NAME_MAX,
# PATH_MAX).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def _no_such_file(path: Any, workspace_root: Path | None) -> bool:
    """``path`` (in the workspace directory) is a name or path too long to exist: not found
    (404), though the path checks call it a refused spelling, which openapi.json cannot state
    (it counts characters, not bytes, and does not know the workspace directory)."""
    if not isinstance(path, str) or workspace_root is None:
        return False
    full = path if path.startswith("/") else f"{workspace_root}/{path}"
    size = len(full.encode("utf-8", "surrogatepass"))
    return size >= MAX_PATH_BYTES or any(
        len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for name in path.split("/")
    )


def _integral(args: dict[str, Any], key: str) -> None:
    """JSON does not tell 7.0 from 7, nor does JSON Schema's "integer": take an integral number as
    the integer it is (the tool schema's check would call 7.0 a number)."""
    value = args.get(key)
    if isinstance(value, float) and value.is_integer():
        args[key] = int(value)


def _api_error(exc: ToolError) -> ApiError:
    return ApiError(HTTP_STATUS.get(exc.code, 400), exc.code, exc.message)


def setup(routes: PluginRoutes, service: KnowledgeService) -> None:
    tool_schemas = {t.name: t.input_schema for t in KnowledgeTools(service).tools()}

    def where_of(request: web.Request, source: dict[str, Any]) -> Where:
        workspace_id = source.get("workspaceId", "default")
        if not isinstance(workspace_id, str) or not workspace_id or len(workspace_id) > 200:
            raise ApiError(400, "invalid_request", "workspaceId must be a non-empty string")
        roots = source.get("allowedRoots", [""])
        if isinstance(roots, str):
            roots = [roots]
        if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
            raise ApiError(400, "invalid_request", "allowedRoots must be a list of strings")
        root = routes.workspace_root(request, workspace_id)  # 404 for another actor's workspace
        return Where(workspace_id, root, roots, routes.in_thread, routes.actor(request))

    def query_where(request: web.Request) -> Where:
        """The workspace a GET names in its query; any other parameter is refused, as the
        document's `additionalProperties: false` says (an empty name included)."""
        unknown = sorted({key for key in request.query} - set(WHERE_KEYS))
        if unknown:
            raise ApiError(400, "invalid_request", f"unknown query parameter(s): {', '.join(map(repr, unknown))}")
        return where_of(request, dict(request.query))

    async def body_of(request: web.Request, schema: dict[str, Any] | None) -> tuple[Where, dict[str, Any]]:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "the body must be a JSON object")
        where = where_of(request, body)
        args = {k: v for k, v in body.items() if k not in WHERE_KEYS}
        _integral(args, "topK")
        if schema is not None:
            try:
                validate_schema(args, schema, "body")
            except ToolError as exc:
                raise _api_error(exc) from exc
        return where, args

    async def status(request: web.Request) -> web.Response:
        return web.json_response(await service.status())

    async def query(request: web.Request) -> web.Response:
        where, args = await body_of(request, tool_schemas["knowledge_rag.query"])
        try:
            result = await service.query(
                where,
                args["query"],
                source_paths=args.get("sourcePaths") or None,
                mode=args.get("mode"),
                top_k=args.get("topK"),
            )
        except ToolError as exc:
            raise _api_error(exc) from exc
        return web.json_response(result)

    async def open_reference(request: web.Request) -> web.Response:
        where, args = await body_of(request, tool_schemas["knowledge_rag.open_reference"])
        try:
            result = await service.open_reference(
                where,
                reference=args.get("reference"),
                reference_id_=args.get("referenceId"),
                file_path=args.get("filePath"),
                source_path=args.get("sourcePath"),
                chunk_id=args.get("chunkId"),
                excerpt=args.get("excerpt"),
                query=args.get("query"),
            )
        except ToolError as exc:
            raise _api_error(exc) from exc
        return web.json_response(result)

    async def add_document(request: web.Request) -> web.Response:
        where, args = await body_of(request, ADD_SCHEMA)
        if _no_such_file(args.get("path"), where.workspace_root):
            raise ApiError(404, "not_found", "no such file: a name or the path is too long to exist")
        try:
            result = await service.add_document(
                where, path=args.get("path"), text=args.get("text"), name=args.get("name")
            )
        except ToolError as exc:
            raise _api_error(exc) from exc
        return web.json_response(result, status=202)

    async def list_documents(request: web.Request) -> web.Response:
        where = query_where(request)
        try:
            documents = await service.list_documents(where)
        except ToolError as exc:
            raise _api_error(exc) from exc
        return web.json_response({"workspaceId": where.workspace_id, "documents": documents})

    async def track(request: web.Request) -> web.Response:
        where = query_where(request)
        try:
            result = await service.track(where, request.match_info["trackId"])
        except ToolError as exc:
            raise _api_error(exc) from exc
        return web.json_response(result)

    async def delete_documents(request: web.Request) -> web.Response:
        where, args = await body_of(request, DELETE_SCHEMA)
        try:
            result = await service.delete_documents(
                where, document_ids=args.get("documentIds"), source_paths=args.get("sourcePaths")
            )
        except ToolError as exc:
            raise _api_error(exc) from exc
        return web.json_response(result, status=202)

    for method, path, handler in (
        ("GET", "/v1/knowledge/status", status),
        ("POST", "/v1/knowledge/query", query),
        ("POST", "/v1/knowledge/open_reference", open_reference),
        ("GET", "/v1/knowledge/documents", list_documents),
        ("POST", "/v1/knowledge/documents", add_document),
        ("DELETE", "/v1/knowledge/documents", delete_documents),
        ("GET", "/v1/knowledge/documents/track/{trackId}", track),
    ):
        routes.add(method, path, handler, openapi=OPENAPI_PATHS[path][method.lower()])
