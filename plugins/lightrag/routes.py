"""``/v1/knowledge/...``: the knowledge facade for hosts (the same service the tools use).

Bodies name the workspace (``workspaceId``, default ``"default"``) and may narrow the readable
roots (``allowedRoots``, default the whole workspace directory) used to read files to add or to
locate citations in. Each route is declared in :mod:`.declared` (its models validate the request
here and give its operation in ``/openapi.json``). Errors use the gateway's JSON error shape.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from aiohttp import web

from agent_gateway import ApiError, PluginRoutes, Route, ToolError

from .declared import (
    ADD_DOCUMENT,
    DELETE_DOCUMENTS,
    LIST_DOCUMENTS,
    OPEN_REFERENCE,
    QUERY,
    STATUS,
    TRACK,
    KnowledgeWhereQuery,
)
from .service import KnowledgeService, Where

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


# No file system the gateway runs on has a longer name, or a longer path with its NUL (NAME_MAX,
# PATH_MAX).
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096


def _no_such_file(path: str | None, workspace_root: Path | None) -> bool:
    """``path`` (in the workspace directory) is a name or path too long to exist: not found
    (404), though the path checks call it a refused spelling, which the document cannot state
    (it counts characters, not bytes, and does not know the workspace directory)."""
    if path is None or workspace_root is None:
        return False
    full = path if path.startswith("/") else f"{workspace_root}/{path}"
    size = len(full.encode("utf-8", "surrogatepass"))
    return size >= MAX_PATH_BYTES or any(
        len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for name in path.split("/")
    )


def _api_error(exc: ToolError) -> ApiError:
    return ApiError(HTTP_STATUS.get(exc.code, 400), exc.code, exc.message)


async def _answer(call: Awaitable[dict[str, Any]], status: int = 200) -> web.Response:
    """The service's answer as JSON, its refusals as the gateway's JSON errors."""
    try:
        result = await call
    except ToolError as exc:
        raise _api_error(exc) from exc
    return web.json_response(result, status=status)


def setup(routes: PluginRoutes, service: KnowledgeService) -> None:
    def where_of(request: web.Request, workspace_id: str, roots: list[str]) -> Where:
        root = routes.workspace_root(request, workspace_id)  # 404 for another actor's workspace
        return Where(workspace_id, root, roots, routes.in_thread, routes.actor(request))

    def query_where(request: web.Request, route: Route[Any, KnowledgeWhereQuery, Any]) -> Where:
        """The workspace a GET names in its query (any other parameter is refused)."""
        asked = route.parse_query(request)
        return where_of(request, asked.workspaceId, [asked.allowedRoots if asked.allowedRoots is not None else ""])

    async def status(request: web.Request) -> web.Response:
        return await _answer(service.status())

    async def query(request: web.Request) -> web.Response:
        body = await QUERY.read_body(request)
        where = where_of(request, body.workspaceId, body.allowedRoots)
        return await _answer(
            service.query(where, body.query, source_paths=body.sourcePaths or None, mode=body.mode, top_k=body.topK)
        )

    async def open_reference(request: web.Request) -> web.Response:
        body = await OPEN_REFERENCE.read_body(request)
        where = where_of(request, body.workspaceId, body.allowedRoots)
        reference = body.reference.model_dump(exclude_unset=True) if body.reference is not None else None
        return await _answer(
            service.open_reference(
                where,
                reference=reference,
                reference_id_=body.referenceId,
                file_path=body.filePath,
                source_path=body.sourcePath,
                chunk_id=body.chunkId,
                excerpt=body.excerpt,
                query=body.query,
            )
        )

    async def add_document(request: web.Request) -> web.Response:
        body = await ADD_DOCUMENT.read_body(request)
        where = where_of(request, body.workspaceId, body.allowedRoots)
        if _no_such_file(body.path, where.workspace_root):
            raise ApiError(404, "not_found", "no such file: a name or the path is too long to exist")
        return await _answer(service.add_document(where, path=body.path, text=body.text, name=body.name), 202)

    async def list_documents(request: web.Request) -> web.Response:
        where = query_where(request, LIST_DOCUMENTS)

        async def listed() -> dict[str, Any]:
            return {"workspaceId": where.workspace_id, "documents": await service.list_documents(where)}

        return await _answer(listed())

    async def track(request: web.Request) -> web.Response:
        where = query_where(request, TRACK)
        return await _answer(service.track(where, TRACK.parse_path(request).trackId))

    async def delete_documents(request: web.Request) -> web.Response:
        body = await DELETE_DOCUMENTS.read_body(request)
        where = where_of(request, body.workspaceId, body.allowedRoots)
        return await _answer(
            service.delete_documents(where, document_ids=body.documentIds, source_paths=body.sourcePaths), 202
        )

    routes.add(STATUS, status)
    routes.add(QUERY, query)
    routes.add(OPEN_REFERENCE, open_reference)
    routes.add(LIST_DOCUMENTS, list_documents)
    routes.add(ADD_DOCUMENT, add_document)
    routes.add(DELETE_DOCUMENTS, delete_documents)
    routes.add(TRACK, track)
