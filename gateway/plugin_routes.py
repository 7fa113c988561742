"""The one door a plugin's HTTP routes go through (the ``register_routes`` hook's ``routes``).

A plugin declares each route with its OpenAPI operation (``routes.add``), so ``/openapi.json``
lists exactly what is served, and its handlers read the gateway only through the methods below:
the caller's actor, the actor's preferences, the caller's runs (created, read and streamed as
``/v1/runs`` does, so a plugin can speak another protocol over them), runtimes, tools (called within
a run's scope, receipted like any call), configuration sections and a worker thread for blocking
work. Nothing here hands out the gateway itself, its storage or its routing table.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from aiohttp import web

from agent_gateway.affinity import ConversationAffinity, ConversationPlan
from agent_gateway.api_models import RunRequest
from agent_gateway.auth import ACTOR_ID, Actor, Auth, identity
from agent_gateway.declare import PATH_VARIABLE as _VARIABLE
from agent_gateway.declare import Route, merge_components, model_names, openapi_path, parse_model
from agent_gateway.errors import ErrorShape, PluginError
from agent_gateway.preferences import Preferences
from agent_gateway.sse import RunEnded, Streams, stream_run
from agent_gateway.workspace_access import WorkspaceAccess, workspace_not_found

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agent_gateway.config import Config
    from agent_gateway.journal import Journal
    from agent_gateway.models import Event, Run
    from agent_gateway.runs import RunManager
    from agent_gateway.runtime import Runtime
    from agent_gateway.storage import Storage
    from agent_gateway.tools import Tool, ToolFacade

log = logging.getLogger("agent_gateway.plugin_routes")

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ShutdownCallback = Callable[[], Awaitable[object] | object]
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
PLUGIN_PREFIX = "/v1/"


def _shape(path: str) -> str:
    """A path with its variables blanked: two routes of the same shape serve the same URLs."""
    return _VARIABLE.sub("{}", path)


@dataclass(frozen=True)
class PluginRoutesDeps:
    """What :class:`PluginRoutes` reads of the gateway (the gateway builds it; plugins never see it)."""

    auth: Auth
    config: Config
    preferences: Preferences
    runs: RunManager
    journal: Journal
    streams: Streams
    workspace_access: WorkspaceAccess
    runtimes: Mapping[str, Runtime]
    tools: ToolFacade
    executor: Executor
    storage: Storage


class PluginRoutes:
    """What ``register_routes(routes)`` gets; see docs/hooks.md.

    Requests reach a plugin's handlers authenticated: :meth:`actor` is the caller. Raise
    :class:`agent_gateway.ApiError` for the gateway's JSON error shape."""

    def __init__(self, deps: PluginRoutesDeps, router: web.UrlDispatcher) -> None:
        self._deps = deps
        self._router = router
        self._openapi: dict[str, dict[str, Any]] = {}
        self._components: dict[str, Any] = {}  # the declared routes' component schemas, by name
        # Declared routes whose operations are not built yet: pydantic builds a model's JSON Schema
        # slowly (about 50 ms for the built-in plugins' routes), so the document is built when first
        # read, not at start-up; the model names are checked at once (declare.model_names).
        self._pending: list[Route[Any, Any, Any]] = []
        self._model_names: dict[str, type[BaseModel]] = {}
        self.error_shapes: dict[str, ErrorShape] = {}  # by canonical route path (errors.ERROR_SHAPES)
        self._on_shutdown: list[ShutdownCallback] = []
        self._closed = False
        self._conversations: ConversationAffinity | None = None

    # -- declaring routes (only while register_routes runs) -----------------------------------------
    @overload
    def add(self, route: Route[Any, Any, Any], handler: Handler, /) -> None: ...

    @overload
    def add(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        openapi: Mapping[str, Any] | None = None,
        error_shape: ErrorShape | None = None,
    ) -> None: ...

    def add(
        self,
        method: str | Route[Any, Any, Any],
        path: str | Handler,
        handler: Handler | None = None,
        *,
        openapi: Mapping[str, Any] | None = None,
        error_shape: ErrorShape | None = None,
    ) -> None:
        """Serve a route with ``handler`` and describe it in ``/openapi.json``.

        ``routes.add(route, handler)``: ``route`` is an :class:`agent_gateway.Route` declaration
        (method, path, body and query models, responses, ``error_shape``); the document's
        operation and component schemas come from it, and the handler validates with it
        (``await route.read_body(request)``). The older form, ``routes.add(method, path,
        handler, openapi=..., error_shape=...)``, takes the OpenAPI operation object as written
        (``summary``, ``requestBody``, ``responses``, ...); without one the route is listed with
        a bare placeholder.

        The path is under ``/v1/`` and uses aiohttp's ``{variable}`` syntax; name its variables
        as the OpenAPI document does (``{hostRunId}``), they are the same path there. A route the
        core or another plugin already serves is a :class:`agent_gateway.PluginError`.
        ``error_shape(status, code, message, extra)``, when given, returns the JSON error body of
        every refusal on this path (another protocol's error shape), those of the core's
        middleware (401, 403, 413) included."""
        declared: Route[Any, Any, Any] | None = None
        operation: dict[str, Any] = {}
        if isinstance(method, Route):
            declared, handler = method, path  # type: ignore[assignment]
            method, path = declared.method, declared.path
            error_shape = declared.error_shape
        elif not isinstance(path, str) or handler is None:
            raise PluginError("routes.add takes (route, handler) or (method, path, handler)")
        else:
            operation = (
                dict(openapi)
                if openapi is not None
                else {
                    "summary": f"{method} {path} (a plugin route without an OpenAPI description)",
                    "responses": {"default": {"description": "See the plugin's documentation."}},
                }
            )
        assert handler is not None and isinstance(path, str)  # (narrowed above)
        method = method.upper()
        if self._closed:
            raise PluginError(f"route {method} {path}: routes can only be added while register_routes runs")
        if method not in METHODS:
            raise PluginError(f"route {method} {path}: method must be one of {', '.join(sorted(METHODS))}")
        if not path.startswith(PLUGIN_PREFIX):
            raise PluginError(f"route {method} {path}: plugin routes live under {PLUGIN_PREFIX}<plugin area>/")
        if self._serves(method, path):
            raise PluginError(f"route {method} {path} is already served (by the core or another plugin)")
        # checked before the route is served: a clash leaves nothing behind
        names = model_names(declared) if declared is not None else {}
        for name, model in names.items():
            taken = self._model_names.get(name)
            if taken is not None and taken is not model:
                raise PluginError(
                    f"route {method} {path}: the component schema {name!r} is already declared by another model"
                )
        if self._deps.auth.authorizing:  # only then: no extra frame per request otherwise
            handler = self._authorized(handler)
        if method == "GET":
            served = self._router.add_get(path, handler)  # and HEAD, as the core's GET routes
        else:
            served = self._router.add_route(method, path, handler)
        if error_shape is not None and served.resource is not None:
            self.error_shapes[served.resource.canonical] = error_shape
        self._model_names.update(names)
        if declared is not None:
            self._pending.append(declared)
        else:
            self._openapi.setdefault(openapi_path(path), {})[method.lower()] = operation

    def _authorized(self, handler: Handler) -> Handler:
        """``handler`` behind ``authorize(actor, "routes:call", {"type": "route", ...})``."""
        auth = self._deps.auth

        async def authorized(request: web.Request) -> web.StreamResponse:
            resource = request.match_info.route.resource
            await auth.authorize(
                request,
                "routes:call",
                {
                    "type": "route",
                    "method": request.method,
                    "path": openapi_path(resource.canonical) if resource is not None else request.path,
                    "params": dict(request.match_info),
                },
            )
            return await handler(request)

        return authorized

    def on_shutdown(self, callback: ShutdownCallback) -> None:
        """Call ``callback()`` (awaited if it returns an awaitable) when the gateway stops, after
        active runs are stopped and runtimes closed, before storage is closed."""
        if self._closed:
            raise PluginError("on_shutdown can only be called while register_routes runs")
        self._on_shutdown.append(callback)

    # -- what handlers may read -------------------------------------------------------------------
    @property
    def config(self) -> Config:
        """The loaded configuration: ``routes.config.section("<name>")``, ``.workspace_roots``."""
        return self._deps.config

    @staticmethod
    def actor(request: web.Request) -> str:
        """The authenticated caller of ``request`` (its actor id)."""
        actor: str = request[ACTOR_ID]
        return actor

    @staticmethod
    def identity(request: web.Request) -> Actor:
        """The authenticated caller of ``request`` as an :class:`agent_gateway.Actor` (its id
        and claims)."""
        return identity(request)

    async def authorize(self, request: web.Request, action: str, resource: Mapping[str, Any]) -> None:
        """Ask the ``authorize`` hooks whether the caller of ``request`` may do ``action`` on
        ``resource``; a denial raises the 403 ``forbidden`` :class:`agent_gateway.ApiError`.
        Every plugin route is already checked as ``routes:call``; ask this for finer actions."""
        auth = self._deps.auth
        if auth.authorizing:
            await auth.authorize(request, action, resource)

    async def preferences(self, actor_id: str) -> dict[str, Any]:
        """The actor's stored preference values (full keys, secrets included: server-side only)."""
        return await self._deps.preferences.load_values(actor_id)

    async def run(self, host_run_id: str, actor_id: str) -> Run | None:
        """The run ``host_run_id`` if it belongs to ``actor_id``, else None (never another actor's)."""
        return await self._deps.runs.get(host_run_id, actor_id)

    async def create_run(self, request: web.Request, body: Mapping[str, Any]) -> tuple[Run, bool]:
        """Create a run for the caller of ``request`` from a ``POST /v1/runs`` body, exactly as that
        route does (the actor's preference defaults, validation, idempotency, admission limits):
        ``(run, created)``, ``created`` False for a repeated ``requestId``. The caller's
        ``workspaces`` claim and the ``authorize`` hooks (``runs:create``) are asked. Refusals are
        :class:`agent_gateway.ApiError` (a 429 carries ``retryAfterSeconds`` in ``extra``)."""
        actor = self.actor(request)
        sent = parse_model(RunRequest, dict(body)).request()  # validated as sent, then the defaults
        filled = await self._deps.preferences.apply_run_defaults(actor, sent)
        check = self._deps.auth.run_create_check(request)
        return await self._deps.runs.create(actor, filled, check, request.headers, validated=True)

    async def run_by_request(
        self, actor_id: str, session_id: str, request_id: str, workspace_id: str = "default"
    ) -> Run | None:
        """The run ``actor_id`` created with ``requestId`` ``request_id`` in that session and
        workspace (the idempotency key), or None; a run just created is found before its row is
        stored (which happens behind its first event)."""
        return await self._deps.runs.find_by_request(actor_id, session_id, workspace_id, request_id)

    async def events(self, run: Run, after_seq: int = 0, limit: int | None = None) -> list[Event]:
        """``run``'s journal events after ``after_seq`` (at most ``limit``), as ``/events`` pages them.
        Get ``run`` with :meth:`run` so it is the caller's."""
        return await self._deps.journal.read(run.host_run_id, after_seq, limit)

    async def stream(
        self,
        request: web.Request,
        run: Run,
        *,
        encode: Callable[[list[Event]], bytes],
        after_seq: int = 0,
        prelude: bytes = b"",
        headers: Mapping[str, str] | None = None,
        merge_deltas: bool = True,
    ) -> web.StreamResponse:
        """Answer ``request`` with ``run``'s events after ``after_seq`` as a server-sent event
        stream, with everything ``/v1/runs/{id}/stream`` does: journal replay then the live tail
        with no gap or duplicate, heartbeats, the slow-client cut-off, the end after the terminal
        event. Each batch of events (in seq order, each event once) is written as
        ``encode(events)``: complete SSE frames, so ``encode`` may keep state across batches of one
        stream (a protocol whose frames depend on what came before). It runs on the event loop,
        for a stream waiting for the run's next events inside the publish of the batch: keep it
        quick, never blocking; an exception from it ends the stream. ``prelude`` (complete frames)
        is written as the stream opens, before any event; ``headers`` are added to the response.
        A client that falls behind its buffer gets text deltas merged (``mergedFrom``,
        ``mergedCount``); with ``merge_deltas=False`` it is replayed from the journal instead, so
        ``encode`` sees every journal event unmerged (frames numbered per event stay dense).
        Get ``run`` with :meth:`run` so it is the caller's.

        Return the response from the handler as it is: the stream starts once aiohttp has sent
        its headers (from the response's ``write_eof``), so an open stream holds no frame of the
        handler or the middleware; do not write to it yourself."""
        return await stream_run(
            request,
            topic=run.host_run_id,
            after_seq=after_seq,
            is_finished=RunEnded(run),
            **self._deps.streams.options(),
            encode=encode,
            prelude=prelude,
            headers=headers,
            merge_deltas=merge_deltas,
        )

    def workspace_root(self, request: web.Request, workspace_id: str) -> Path | None:
        """The directory of ``workspace_id`` for the caller of ``request`` (None: not configured).
        Raises :class:`agent_gateway.ApiError` 404 ``workspace_not_found`` when it is another actor's
        (``[workspaces] owners``, or the caller's ``workspaces`` claim): a route that names a
        workspace itself checks it here."""
        self._deps.workspace_access.require(self.actor(request), workspace_id)
        if not self._deps.auth.may_use_workspace(request, workspace_id):
            raise workspace_not_found(workspace_id)
        return self._deps.config.workspace_roots.get(workspace_id)

    def agent_ids(self) -> list[str]:
        """The ids of every registered runtime (what ``GET /v1/agents`` lists), sorted."""
        return sorted(self._deps.runtimes)

    async def availability(self, agent_id: str) -> dict[str, Any]:
        """Whether the registered agent ``agent_id`` can run here: ``{"available": bool, "reason":
        str | None, ...}`` (its descriptor's ``availability``; the reason says what to install or
        set). :meth:`create_run` refuses a run for an unavailable agent with a 503
        ``agent_unavailable`` :class:`agent_gateway.ApiError`; a route that lists agents omits or
        flags them. Cached for a few seconds: cheap to ask per request."""
        return await self._deps.runs.availability.get(agent_id)

    def runtime(self, agent_id: str) -> Runtime | None:
        """The registered runtime of ``agent_id``, or None."""
        return self._deps.runtimes.get(agent_id)

    def tool(self, name: str) -> Tool | None:
        """The registered tool ``name``, or None."""
        return self._deps.tools.tools.get(name)

    async def call_tool(self, name: str, arguments: Any, run: Run, *, caller: str = "route") -> dict[str, Any]:
        """Call tool ``name`` within ``run``'s scope (its workspace, allowed roots and disabled
        capabilities), as the run's actor: the same pipeline, receipt and events as an agent's call.
        Get ``run`` with :meth:`run` so it is the caller's. Raises :class:`agent_gateway.ToolError`, or
        :class:`agent_gateway.ApiError` 404 ``workspace_not_found`` when the run's actor may not use
        its workspace (``[workspaces] owners``)."""
        self._deps.workspace_access.require(run.actor_id, run.workspace_id)  # else a 404 ApiError
        facade = self._deps.tools
        return await facade.call(name, arguments, facade.scope_for(run), caller=caller)

    async def cancel_run(self, host_run_id: str, actor_id: str) -> Run | None:
        """Cancel the run (as ``POST /v1/runs/{id}/cancel``); the run, or None if not ``actor_id``'s."""
        return await self._deps.runs.cancel(host_run_id, actor_id)

    async def wait_run(self, run: Run) -> Run:
        """Wait until ``run`` (got with :meth:`run`) has ended; its final record."""
        await self._deps.runs.wait(run.host_run_id)
        return await self._deps.runs.get(run.host_run_id, run.actor_id) or run

    # -- conversation affinity (docs/sessions.md) ---------------------------------------------------
    @property
    def _affinity(self) -> ConversationAffinity:
        if self._conversations is None:
            deps = self._deps
            self._conversations = ConversationAffinity(deps.storage, deps.journal.write, self.wait_run, self.events)
        return self._conversations

    async def conversation(
        self,
        request: web.Request,
        agent_id: str,
        earlier: list[tuple[str, str]],
        *,
        session_id: str | None = None,
        new_session_id: str | None = None,
        claimer: str | None = None,
    ) -> ConversationPlan:
        """The session of a request, from its history when it names none (``session_id``, which
        always wins): ``earlier`` is the ``(role, text)`` of its messages before the last user
        message. A history that ends where one of the caller's sessions with ``agent_id`` ended
        continues it (claimed: a second request with that history gets a new session); any other
        starts a new session (``new_session_id``, default a random one) that holds that history.
        ``claimer``: the request's idempotency key. Call :meth:`follow_conversation` with the run
        created (see docs/sessions.md, "Conversation affinity")."""
        return await self._affinity.plan(
            self.actor(request),
            agent_id,
            earlier,
            session_id=session_id,
            new_session_id=new_session_id,
            claimer=claimer,
        )

    def follow_conversation(self, run: Run, plan: ConversationPlan, message: str) -> None:
        """Remember ``run``'s conversation (``plan``'s turns, ``message``, its answer) once it has
        completed, so the next request resending it continues the session."""
        self._affinity.follow(run, plan, message)

    async def release_conversation(self, plan: ConversationPlan) -> None:
        """The request of ``plan`` created no run (refused): the session it claimed may be
        continued again."""
        await self._affinity.release(plan)

    async def session_known(self, actor_id: str, session_id: str) -> bool:
        """Whether ``actor_id`` has a session ``session_id`` (a record or a run)."""
        return bool(await self._deps.journal.write(self._affinity.known, actor_id, session_id))

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` on the gateway's worker threads, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._deps.executor, fn, *args)

    # -- for the core ---------------------------------------------------------------------------------
    def _build_pending(self) -> None:
        """The operations and component schemas of the declared routes not built yet."""
        while self._pending:
            route = self._pending.pop(0)
            operation, components = route.openapi_operation()
            merge_components(self._components, components, f"route {route.method} {route.path}")
            self._openapi.setdefault(route.openapi_path, {})[route.method.lower()] = operation

    @property
    def openapi_paths(self) -> Mapping[str, Mapping[str, Any]]:
        """The OpenAPI path items of every plugin route, read-only (built when first read)."""
        return _BuiltWhenRead(self._openapi, self._build_pending)

    @property
    def openapi_components(self) -> Mapping[str, Any]:
        """The component schemas the declared plugin routes refer to, by name (built when first read)."""
        return _BuiltWhenRead(self._components, self._build_pending)

    def close(self) -> None:
        """No more routes: called once every plugin's register_routes has run."""
        self._closed = True

    async def shutdown(self) -> None:
        if self._conversations is not None:
            await self._conversations.close()
        for callback in self._on_shutdown:
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:  # one plugin's failure must not keep storage open
                log.exception("a plugin route shutdown callback failed")

    def _serves(self, method: str, path: str) -> bool:
        shape = _shape(path)
        for route in self._router.routes():
            resource = route.resource
            if resource is not None and _shape(resource.canonical) == shape and route.method in (method, "*"):
                return True
        return False


class _BuiltWhenRead(Mapping[str, Any]):
    """A read-only view of ``data`` that runs ``build`` (which fills it) before every read."""

    def __init__(self, data: Mapping[str, Any], build: Callable[[], None]) -> None:
        self._data, self._build = data, build

    def __getitem__(self, key: str) -> Any:
        self._build()
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        self._build()
        return iter(dict(self._data))

    def __len__(self) -> int:
        self._build()
        return len(self._data)
