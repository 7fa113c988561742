"""/v1/sessions: list, search, read back, export, rename/pin and delete sessions (docs/sessions.md).

A session is a gateway ``sessionId`` within an actor (as runs define it). Everything here is
actor-scoped: another actor's session is a 404. The index is kept by :class:`SessionIndexer`, a
run listener: every status change updates the session's row, and a run's end stores its digest
(from the ``transcript`` projection) for counts and full-text search.

The feature in parts: :mod:`.indexer` (the session index, a run listener), :mod:`.handlers` (the
routes, input and cursor helpers), :mod:`.export` (the Markdown export), :mod:`.declared` (the
routes' declarations: path, query and body models, responses; ``/openapi.json`` lists them).
"""

from __future__ import annotations

from aiohttp import web

from agent_gateway.routes.sessions import declared
from agent_gateway.routes.sessions.declared import DECLARED
from agent_gateway.routes.sessions.handlers import SessionRoutes
from agent_gateway.routes.sessions.indexer import SessionIndexer, SessionsDeps, run_digest

__all__ = ["DECLARED", "SessionIndexer", "SessionRoutes", "SessionsDeps", "run_digest", "setup"]


def setup(app: web.Application, deps: SessionsDeps) -> None:
    indexer = SessionIndexer(deps)
    deps.runs.listeners.append(indexer.on_run)
    app.on_cleanup.append(indexer.stop)
    routes = SessionRoutes(deps, indexer)
    for route, handler in (
        (declared.LIST, routes.list),
        (declared.BULK_DELETE, routes.bulk_delete),
        (declared.GET, routes.get),
        (declared.PATCH, routes.patch),
        (declared.DELETE, routes.delete),
        (declared.EXPORT, routes.export),
        (declared.DELETE_AGENT_SESSION, routes.delete_agent_session),
    ):
        app.router.add_route(route.method, route.path, handler)
