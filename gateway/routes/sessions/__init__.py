"""/v1/sessions: list, search, read back, export, rename/pin and delete sessions (docs/sessions.md).

A session is a gateway ``sessionId`` within an actor (as runs define it). Everything here is
actor-scoped: another actor's session is a 404. The index is kept by :class:`SessionIndexer`, a
run listener: every status change updates the session's row, and a run's end stores its digest
(from the ``transcript`` projection) for counts and full-text search.

The feature in parts: :mod:`.indexer` (the session index, a run listener), :mod:`.handlers` (the
routes, input and cursor helpers), :mod:`.export` (the Markdown export), :mod:`.openapi` (the
routes' OpenAPI declarations).
"""

from __future__ import annotations

from aiohttp import web

from agent_gateway.routes.sessions.handlers import SessionRoutes
from agent_gateway.routes.sessions.indexer import SessionIndexer, SessionsDeps, run_digest
from agent_gateway.routes.sessions.openapi import OPENAPI_PATHS, OPENAPI_SCHEMAS

__all__ = ["OPENAPI_PATHS", "OPENAPI_SCHEMAS", "SessionIndexer", "SessionRoutes", "SessionsDeps", "run_digest", "setup"]


def setup(app: web.Application, deps: SessionsDeps) -> None:
    indexer = SessionIndexer(deps)
    deps.runs.listeners.append(indexer.on_run)
    app.on_cleanup.append(indexer.stop)
    routes = SessionRoutes(deps, indexer)
    app.router.add_get("/v1/sessions", routes.list)
    app.router.add_post("/v1/sessions:delete", routes.bulk_delete)
    app.router.add_get("/v1/sessions/{session_id}", routes.get)
    app.router.add_patch("/v1/sessions/{session_id}", routes.patch)
    app.router.add_delete("/v1/sessions/{session_id}", routes.delete)
    app.router.add_get("/v1/sessions/{session_id}/export", routes.export)
    app.router.add_delete("/v1/sessions/{session_id}/agent-session", routes.delete_agent_session)
