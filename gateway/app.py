"""create_app: wires storage, journal, bus, runtimes and routes from config and plugins."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from agent_gateway.auth import ACTOR_ID, AUTH_KEY, IDENTITY, Actor, Auth
from agent_gateway.browser_guard import BrowserGuard, guard_from_config
from agent_gateway.bus import Bus
from agent_gateway.cluster import Coordinator
from agent_gateway.config import Config, redact_url, section_specs_from_hook
from agent_gateway.descriptors import AgentAvailability, Descriptors
from agent_gateway.errors import ERROR_SHAPES, ApiError, error_response, json_error
from agent_gateway.files import FS_TOOLS, AgentFiles
from agent_gateway.journal import Journal
from agent_gateway.lifecycle import GatewayContext
from agent_gateway.mcp import MCP_PATH
from agent_gateway.mcp import http as mcp_http
from agent_gateway.mcp.surface import McpSurface
from agent_gateway.mcp.wiring import mcp_servers_for
from agent_gateway.models import Event, Run
from agent_gateway.plugin_host import PluginError, PluginHost
from agent_gateway.plugin_routes import PluginRoutes, PluginRoutesDeps
from agent_gateway.preferences import Preferences
from agent_gateway.retention import StorageMaintenance
from agent_gateway.routes import agents, console, metrics, receipts, runs, system, workspaces
from agent_gateway.routes import preferences as preferences_routes
from agent_gateway.routes import sessions as sessions_routes
from agent_gateway.runs import RunManager
from agent_gateway.runtime import Runtime, TurnServices
from agent_gateway.sandbox import Sandbox
from agent_gateway.sandbox.egress import SandboxNetwork
from agent_gateway.server.allocator import HeapTrimmer
from agent_gateway.server.loop_monitor import LoopLagMonitor
from agent_gateway.sse import Streams, StreamStats
from agent_gateway.tools import ToolFacade
from agent_gateway.watcher import Watcher
from agent_gateway.webhooks import Webhooks
from agent_gateway.workspace_access import WorkspaceAccess

log = logging.getLogger("agent_gateway.app")
T = TypeVar("T")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC_PATHS = frozenset({"/v1/health", "/openapi.json", MCP_PATH, *console.PUBLIC_PATHS})
METRICS_PATH = "/metrics"
# A Host header (RFC 9110 7.2): an IP literal or a registered name, then an optional port.
_HOST_HEADER = re.compile(r"(?:\[[0-9A-Za-z:.%]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::([0-9]{0,5}))?")
STREAMS_CLOSE_SECONDS = 2.0  # at shutdown, for streams to write their last events and end


class StartupError(Exception):
    """The gateway could not start (storage could not be opened, ...): a one-line reason."""


class LocalInstance:
    """What the cluster coordinator may use of this gateway instance
    (:class:`agent_gateway.cluster.ClusterInstance`)."""

    def __init__(
        self,
        bus: Bus,
        journal: Journal,
        runs: RunManager,
        executor: ThreadPoolExecutor,
        base_url: Callable[[], str | None],
    ) -> None:
        self._bus = bus
        self._journal = journal
        self._runs = runs
        self._executor = executor
        self._base_url = base_url

    @property
    def base_url(self) -> str | None:
        return self._base_url()

    def publish(self, topic: str, events: list[Event]) -> None:
        self._bus.publish_many(topic, events)

    def has_streams(self, topic: str) -> bool:
        return self._bus.subscriber_count(topic) > 0

    def resync(self, topic: str | None = None) -> None:
        self._bus.resync((lambda t: True) if topic is None else (lambda t: t == topic))

    async def create_run(self, actor_id: str, body: Any) -> tuple[Run, bool]:
        return await self._runs.create(actor_id, body)

    async def cancel_run(self, host_run_id: str, actor_id: str) -> Run | None:
        return await self._runs.cancel(host_run_id, actor_id)

    async def resolve_permission(self, host_run_id: str, actor_id: str, request_id: str, option_id: Any) -> None:
        await self._runs.resolve_permission(host_run_id, actor_id, request_id, option_id)

    def active_run_ids(self) -> list[str]:
        return [run.host_run_id for run in self._runs.active_runs()]

    def abandon_runs(self) -> None:
        self._runs.abandon()

    async def flush_journal(self) -> None:
        await self._journal.flush()

    @property
    def journal_pending(self) -> int:
        return self._journal.pending

    @property
    def fenced_events(self) -> int:
        return self._journal.fenced

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


class Gateway:
    """Everything a request handler needs, built once per app."""

    def __init__(self, config: Config, plugins: PluginHost) -> None:
        self.config = config
        self.plugins = plugins
        gw = config.section("gateway")
        self.max_body_bytes = int(gw["max_body_bytes"])
        self.heartbeat = float(gw["heartbeat_seconds"])
        self.stream_capacity = int(gw["stream_buffer_events"])
        self.stream_send_timeout = float(gw["stream_send_timeout_seconds"])
        self.shutdown_grace = float(gw["shutdown_grace_seconds"])
        self.shutting_down = False  # set by `drain`: new requests get 503
        self._drained: asyncio.Future[None] | None = None
        self.tokens = config.tokens
        # Who is calling and what they may do (the authenticate/authorize hooks).
        self.auth = Auth(config, plugins)
        self.public_metrics = bool(config.section("auth")["public_metrics"])
        self.data_dir: Path = config.data_dir
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="storage")
        try:
            storage = plugins.storage_backend(config.storage_url, config)
        except PluginError:
            raise
        except Exception as exc:  # e.g. a malformed URL: say which setting, not a traceback
            raise StartupError(f"storage {redact_url(config.storage_url)}: {type(exc).__name__}: {exc}") from exc
        if storage is None:
            raise PluginError(
                f"no storage plugin handles {redact_url(config.storage_url)!r} ([storage] url; the built-in "
                "journal handles sqlite:// and postgresql://)"
            )
        # One instance unless a plugin says this is one of several (the cluster family).
        self.coordinator: Coordinator = plugins.cluster_coordinator(config) or Coordinator()
        storage = self.coordinator.wrap_storage(storage)
        self.storage = storage
        self.bus = Bus()
        durable = self.coordinator.durable_delivery
        self.loop_monitor = LoopLagMonitor(float(gw["loop_lag_warn_ms"]))
        self.journal = Journal(
            storage,
            self.bus,
            # Delivered only once committed, an event needs no spool to outlive a crash.
            None if durable else self.data_dir / "spool",
            batch_max=int(gw["journal_batch_events"]),
            read_executor=self.executor,
            durable_delivery=durable,
            tail_bytes=int(gw["journal_memory_mb"]) * 1024 * 1024,
        )
        storage_section = config.section("storage")
        # Compaction and retention ([storage]): a background task, never on a request's path.
        self.maintenance = StorageMaintenance(
            storage,
            self.journal,
            self.executor,
            compact=bool(storage_section["compact_after_terminal"]),
            retain_days=float(storage_section["retain_days"]),
            interval_seconds=float(storage_section["maintenance_interval_seconds"]),
        )
        self.journal.on_commit.append(self.coordinator.committed)
        self.runtimes: dict[str, Runtime] = {}
        for runtime in plugins.runtimes(config):
            if runtime.agent_id in self.runtimes:
                raise PluginError(
                    f"agent id {runtime.agent_id!r} registered twice (by two plugins, or by a plugin and "
                    f"an [acp_agents.{runtime.agent_id}] table): agent ids must be unique"
                )
            self.runtimes[runtime.agent_id] = runtime
        strategies = {}
        for agent_id, runtime in self.runtimes.items():
            # A plugin's hook, else the core's default: the runtime's own strategy or the transcript.
            strategy = plugins.session_strategy(runtime, config) or getattr(runtime, "session_strategy", None)
            if strategy is not None:
                strategies[agent_id] = strategy
        self.projections = plugins.projections()
        # What plugin routes were given (register_routes); create_app sets it.
        self.plugin_routes: PluginRoutes | None = None
        # Who may use which workspace ([workspaces] owners): runs, tools and workspace streams.
        self.workspace_access = WorkspaceAccess.of(config.workspace_roots, config.workspace_owners)
        self.tools = ToolFacade(
            [*plugins.tools(config), *FS_TOOLS],
            plugins,
            storage,
            self.executor,
            self.journal,
            workspace_roots=config.workspace_roots,
            workspace_access=self.workspace_access,
        )
        if self.auth.authorizing:
            self.tools.authorize = self.auth.tool_call_allowed
        self.stream_stats = StreamStats()
        # Where agents call back (MCP). Never taken from a request's Host header: the configured
        # public URL, else the launcher sets the listening URL, else (an embedding app's own
        # runner) the local address of the first accepted connection.
        self.public_url: str | None = str(gw["public_url"]).rstrip("/") or None
        self.files = AgentFiles(self.tools)
        # The MCP surface agents reach the tools through (its leases resolve against active runs).
        self.mcp = McpSurface(self.tools, lambda: self.runs.active_runs(), lambda: self.public_url)
        # Agent processes start confined ([sandbox]): their network reaches the gateway only through
        # sockets of its own (an allow-listing egress proxy, and an MCP-only server).
        mcp_only = web.Application(client_max_size=self.max_body_bytes)
        mcp_http.setup(mcp_only, self.mcp)
        self.sandbox_network = SandboxNetwork(mcp_only)
        self.sandbox = Sandbox(
            config.section("sandbox"),
            plugins,
            data_dir=self.data_dir,
            config_path=Path(config.path).resolve() if config.path else None,
            egress=self.sandbox_network.open_egress,
            mcp_socket=self.sandbox_network.mcp_socket,
        )
        # What every turn is lent (Turn.data_dir, .sandbox, .mcp_servers(), ...): no runtime imports the app.
        self.turn_services = TurnServices(
            data_dir=self.data_dir,
            workspace_roots=config.workspace_roots,
            sandbox=self.sandbox,
            tools=self.tools,
            files=self.files,
            base_url=lambda: self.public_url,
            mcp_servers_for=mcp_servers_for(self.mcp),
            negotiate_runtime_policy=plugins.negotiate_runtime_policy,
        )
        # Agents' availability, believed for a few seconds (run creation and descriptors share it).
        self.availability = AgentAvailability(self.runtimes, self.executor)
        auth_section = config.section("auth")
        admins = auth_section.get("admins") or []
        # The agents' descriptors and the actors' preferences (one-way: preferences use descriptors).
        self.descriptors = Descriptors(
            self.runtimes,
            self.tools.tools,
            lambda: plugins.setting_fields(config),
            self.executor,
            self.availability,
            auth_required=self.auth.required,
            admins=admins if isinstance(admins, list) else [],
        )
        self.preferences = Preferences(
            self.descriptors,
            storage,
            self.journal,
            self.executor,
            self.runtimes,
            cached=not self.coordinator.clustered,  # another instance may write them
        )
        self.runs = RunManager(
            storage,
            self.journal,
            self.runtimes,
            strategies,
            self.executor,
            run_timeout=float(gw["run_timeout_seconds"]),
            turn_services=self.turn_services,
            tools=self.tools,
            disabled_capabilities=self.preferences.disabled_capabilities,
            trace_run=lambda run, name, headers: plugins.trace_run(run, name, headers, config),
            max_queued_per_session=int(gw["max_queued_runs_per_session"]),
            max_active_per_actor=int(gw["max_active_runs_per_actor"]),
            multitask_strategy=str(gw["multitask_strategy"]),
            multitask_strategy_by_agent=dict(gw["multitask_strategy_by_agent"]),
            max_run_journal_bytes=int(gw["max_run_journal_bytes"]),
            max_actor_journal_bytes_per_day=int(gw["max_actor_journal_bytes_per_day"]),
            workspace_access=self.workspace_access,
            coordinator=self.coordinator,
            availability=self.availability,
        )
        # Run webhooks ([webhooks]): deliveries from the journal's outbox, after each run ends.
        self.webhooks = Webhooks(config.section("webhooks"), storage, self.executor)
        if self.webhooks.enabled:
            self.runs.webhook_url = self.webhooks.url_for
            self.runs.listeners.append(self.webhooks.run_changed)
        # The workspaces' files.changed streams: told of facade writes and of run changes.
        self.watcher = Watcher(self.journal, config.workspace_roots, self.executor, self.runs.active_runs)
        self.tools.write_observers.append(self.watcher)
        self.runs.listeners.append(self.watcher.run_changed)
        self.streams = Streams(
            self.journal, self.bus, self.stream_capacity, self.heartbeat, self.stream_stats, self.stream_send_timeout
        )
        # What plugins' gateway_startup / gateway_shutdown get (never the aiohttp application).
        self.context = GatewayContext(config, self.data_dir, _base_url=lambda: self.public_url)
        # Freed heap pages go back to the system after runs end: RSS settles between runs.
        self.heap_trimmer = HeapTrimmer(None, lambda: len(self.runs.active_runs()))
        self.runs.listeners.append(self.heap_trimmer.after_run)

    def set_public_url(self, url: str) -> None:
        """The base URL agents' MCP clients call back on (see ``[gateway] public_url``)."""
        self.public_url = url.rstrip("/")

    def learn_listening_address(self, request: web.Request) -> None:
        """With no public URL yet, take the local address the connection was accepted on (the
        listening socket's, never the client-controlled Host header)."""
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        if not isinstance(sockname, tuple) or len(sockname) < 2:
            return
        host, port = str(sockname[0]), int(sockname[1])
        self.set_public_url(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")

    async def start(self, app: web.Application) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.storage.open)
        except Exception as exc:
            raise StartupError(
                f"storage {redact_url(self.config.storage_url)} could not be opened: {type(exc).__name__}: "
                + " ".join(str(exc).split())
            ) from exc
        await self.journal.start()
        await self.coordinator.start(
            LocalInstance(self.bus, self.journal, self.runs, self.executor, lambda: self.public_url)
        )
        self.loop_monitor.start()
        interrupted = await self.runs.recover()
        await self.watcher.start()
        await self.maintenance.start()
        await self.webhooks.start()  # after `recover`: runs a crash left active now have their end
        if interrupted:
            log.warning("marked %d run(s) left active by a previous process as interrupted", interrupted)
        await self.plugins.startup(self.context)

    async def drain(self, app: web.Application | None = None) -> None:
        """The first step of stopping, before the server waits for request handlers: refuse new
        requests (503), end the streams that have nothing left to wait for, give active runs
        ``shutdown_grace_seconds`` to finish, interrupt the rest (their terminal events reach
        their streams), then end every stream. Bounded by the grace plus a few seconds; runs once
        (the launcher calls it on SIGTERM, aiohttp's on_shutdown again)."""
        if self._drained is not None:
            return await asyncio.shield(self._drained)
        self._drained = asyncio.get_running_loop().create_future()
        try:
            self.shutting_down = True
            active = {run.host_run_id for run in self.runs.active_runs()}
            self.stream_stats.stop_all(keep=lambda topic: topic in active)
            await self.runs.drain(self.shutdown_grace)
            self.stream_stats.stop_all()  # each writes what it has buffered (a terminal event) first
            if not await self.stream_stats.wait_closed(STREAMS_CLOSE_SECONDS):
                log.warning(
                    "%d stream(s) did not end in time; their connections are dropped", self.stream_stats.open_streams
                )
                self.stream_stats.abort_all()
                await self.stream_stats.wait_closed(STREAMS_CLOSE_SECONDS)
        finally:
            self._drained.set_result(None)

    async def stop(self, app: web.Application) -> None:
        await self.drain()
        await self.watcher.stop()
        await self.runs.shutdown()
        await self.coordinator.stop()
        for runtime in self.runtimes.values():
            try:
                await runtime.close()
            except Exception:
                log.exception("runtime %s failed to close", runtime.agent_id)
        await self.sandbox_network.close()
        await self.plugins.shutdown(self.context)
        if self.plugin_routes is not None:
            await self.plugin_routes.shutdown()
        await self.maintenance.stop()
        await self.webhooks.stop()
        self.heap_trimmer.stop()
        await self.journal.close()
        self.loop_monitor.stop()
        loop = asyncio.get_running_loop()
        # A cancelled await does not stop its worker thread: let every storage call still running
        # finish before closing the connections under it (closing one in use crashed SQLite).
        await loop.run_in_executor(None, self.executor.shutdown, True)
        await loop.run_in_executor(None, self.storage.close)


GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)


def gateway_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


def _shutting_down() -> web.Response:
    """503 for a request that arrives once the gateway is stopping (storage and agents are about
    to close under it), with Connection: close."""
    response = error_response(503, "shutting_down", "the gateway is shutting down; retry shortly")
    response.headers["Retry-After"] = "1"
    response.force_close()
    return response


def _check_host(request: web.Request) -> None:
    """400 for a Host header that is not ``host[:port]`` (``localhost:evil``): before any route
    parses it (``request.url`` raises on it)."""
    host = request.headers.get("Host")
    if host is None:
        return
    match = _HOST_HEADER.fullmatch(host)
    if match is None or (match.group(1) and int(match.group(1)) > 65535):
        raise ApiError(400, "invalid_host", "the Host header must be host[:port], with a numeric port up to 65535")


def _authenticate(gateway: Gateway, request: web.Request) -> Actor | Awaitable[Actor] | None:
    """The caller of ``request`` (the ``authenticate`` hooks; 401 when nobody vouches for it), or
    None on public paths."""
    if gateway.public_url is None:
        gateway.learn_listening_address(request)
    if request.path in PUBLIC_PATHS or (request.path == METRICS_PATH and gateway.public_metrics):
        return None
    return gateway.auth.authenticate(request)


def gateway_middleware(guard: BrowserGuard) -> Middleware:
    """The gateway's one middleware, in order: errors as JSON (`json_error`, around all of it), a
    503 while stopping, a 400 for a malformed Host, the browser guard, authentication, then the
    route.

    One middleware rather than one per step: each is a coroutine frame that an open stream holds
    for as long as it lasts (10,000 idle SSE clients), and nothing is built per request on the way
    to the route."""

    @web.middleware
    async def gateway_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            gateway = request.app[GATEWAY_KEY]
            if gateway.shutting_down:
                return _shutting_down()
            _check_host(request)
            preflight = guard.check(request)
            if preflight is not None:
                return preflight
            actor = _authenticate(gateway, request)
            if actor is not None:
                if not isinstance(actor, Actor):  # a plugin answered with an awaitable
                    actor = await actor
                request[IDENTITY] = actor
                request[ACTOR_ID] = actor.id
            return await handler(request)
        except Exception as exc:
            return json_error(request, exc)

    return gateway_middleware


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_app(config: Config | None = None, plugins: PluginHost | None = None) -> web.Application:
    plugins = plugins or PluginHost.load()
    config = config or Config.load()
    for spec in section_specs_from_hook(plugins.config_sections()):
        config.add_section(spec)
    gateway = Gateway(config, plugins)
    guard = guard_from_config(gateway.auth.required, config.section("gateway"))
    app = web.Application(
        middlewares=[gateway_middleware(guard)],
        client_max_size=gateway.max_body_bytes,
    )
    app.on_response_prepare.append(guard.add_cors_headers)
    app[GATEWAY_KEY] = gateway
    app[AUTH_KEY] = gateway.auth
    gw = gateway
    plugin_routes = gateway.plugin_routes = PluginRoutes(
        PluginRoutesDeps(
            gw.auth,
            config,
            gw.preferences,
            gw.runs,
            gw.journal,
            gw.streams,
            gw.workspace_access,
            gw.runtimes,
            gw.tools,
            gw.executor,
            gw.storage,
        ),
        app.router,
    )
    app[ERROR_SHAPES] = plugin_routes.error_shapes
    runs.setup(
        app,
        runs.RunRoutesDeps(
            gw.auth, gw.runs, gw.journal, gw.streams, gw.preferences, gw.projections, gw.webhooks, gw.executor
        ),
    )
    agents.setup(app, gw.auth, gw.runtimes, gw.preferences)
    system_sources = system.SystemSources(
        gw.runtimes,
        gw.projections,
        gw.auth.required,
        gw.public_metrics,
        gw.descriptors,
        gw.storage,
        gw.journal,
        gw.executor,
        gw.runs,
        gw.coordinator,
    )
    system.setup(app, system_sources, plugin_routes.openapi_paths, plugin_routes.openapi_components)
    receipts.setup(app, gw.auth, gw.runs, gw.storage, gw.executor)
    metric_sources = metrics.MetricSources(
        gw.runs,
        gw.runtimes,
        gw.journal,
        gw.bus,
        gw.stream_stats,
        gw.loop_monitor,
        gw.coordinator,
        gw.sandbox_network.counters,
    )
    metrics.setup(app, gw.auth, metric_sources)
    workspaces.setup(app, gw.auth, gw.watcher, gw.workspace_access, gw.streams)
    mcp_http.setup(app, gw.mcp)
    preferences_routes.setup(app, gw.auth, gw.preferences)
    sessions_routes.setup(
        app, sessions_routes.SessionsDeps(gw.auth, gw.storage, gw.journal, gw.runs, gw.runtimes, gw.executor)
    )
    console.setup(app)
    plugins.register_routes(plugin_routes)  # after the core's: a plugin cannot take a core path
    plugin_routes.close()
    app.on_startup.append(gateway.start)
    app.on_shutdown.append(gateway.drain)
    app.on_cleanup.append(gateway.stop)
    return app
