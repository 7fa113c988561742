"""create_app: wires storage, journal, bus, runtimes and routes from config and plugins."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from agent_gateway.bus import Bus
from agent_gateway.config import Config, section_specs_from_hook
from agent_gateway.errors import ApiError, json_errors
from agent_gateway.files import FS_TOOLS, AgentFiles
from agent_gateway.journal import Journal
from agent_gateway.mcp import MCP_PATH
from agent_gateway.mcp import http as mcp_http
from agent_gateway.mcp.wiring import mcp_servers_for
from agent_gateway.plugin_host import PluginError, PluginHost
from agent_gateway.routes import agents, metrics, receipts, runs, system, workspaces
from agent_gateway.routes import preferences as preferences_routes
from agent_gateway.runs import RunManager
from agent_gateway.runtime import Runtime
from agent_gateway.sse import StreamStats
from agent_gateway.tools import ToolFacade
from agent_gateway.watcher import Watcher

log = logging.getLogger("agent_gateway.app")

LOCAL_ACTOR = "local"
PUBLIC_PATHS = frozenset({"/v1/health", "/openapi.json", "/metrics", MCP_PATH})


class Gateway:
    """Everything a request handler needs, built once per app."""

    def __init__(self, config: Config, plugins: PluginHost) -> None:
        self.config = config
        self.plugins = plugins
        gw = config.section("gateway")
        self.max_body_bytes = int(gw["max_body_bytes"])
        self.heartbeat = float(gw["heartbeat_seconds"])
        self.stream_capacity = int(gw["stream_buffer_events"])
        self.tokens = config.tokens
        self.data_dir: Path = config.data_dir
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="storage")
        storage = plugins.storage_backend(config.storage_url, config)
        if storage is None:
            raise PluginError(f"no storage plugin handles {config.storage_url!r}")
        self.storage = storage
        self.bus = Bus()
        self.journal = Journal(
            storage,
            self.bus,
            self.data_dir / "spool",
            batch_max=int(gw["journal_batch_events"]),
            read_executor=self.executor,
        )
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
        # OpenAPI path items of plugin routes, merged into /openapi.json.
        self.openapi_paths: dict[str, Any] = {}
        self.tools = ToolFacade(
            [*plugins.tools(config), *FS_TOOLS],
            plugins,
            storage,
            self.executor,
            self.journal,
            workspace_roots=config.workspace_roots,
        )
        self.stream_stats = StreamStats()
        # What runtimes may use through `turn.services` (no runtime imports the app).
        self.services: dict[str, Any] = {
            "config": config,
            "plugins": plugins,
            "gateway": self,
            "data_dir": self.data_dir,
            "workspace_roots": config.workspace_roots,
            "tools": self.tools,
            "files": AgentFiles(self.tools),
        }
        self.services["mcp_servers_for"] = mcp_servers_for(self)
        self.runs = RunManager(
            storage,
            self.journal,
            self.runtimes,
            strategies,
            self.executor,
            run_timeout=float(gw["run_timeout_seconds"]),
            services=self.services,
        )
        self.watcher = Watcher(self)

    def actor_for(self, request: web.Request) -> str:
        if not self.tokens:
            return LOCAL_ACTOR
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        actor = self.tokens.get(token.strip())
        if actor is None:
            raise ApiError(401, "unauthorized", "unknown token")
        return actor

    async def start(self, app: web.Application) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        await asyncio.get_running_loop().run_in_executor(self.executor, self.storage.open)
        await self.journal.start()
        interrupted = await self.runs.recover()
        await self.watcher.start()
        if interrupted:
            log.warning("marked %d run(s) left active by a previous process as interrupted", interrupted)
        await self.plugins.startup(app)

    async def stop(self, app: web.Application) -> None:
        await self.watcher.stop()
        await self.runs.shutdown()
        for runtime in self.runtimes.values():
            try:
                await runtime.close()
            except Exception:
                log.exception("runtime %s failed to close", runtime.agent_id)
        await self.plugins.shutdown(app)
        await self.journal.close()
        loop = asyncio.get_running_loop()
        # A cancelled await does not stop its worker thread: let every storage call still running
        # finish before closing the connections under it (closing one in use crashed SQLite).
        await loop.run_in_executor(None, self.executor.shutdown, True)
        await loop.run_in_executor(None, self.storage.close)


GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)


def gateway_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]


@web.middleware
async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path not in PUBLIC_PATHS:
        request["actor"] = request.app[GATEWAY_KEY].actor_for(request)
    return await handler(request)


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
    app = web.Application(middlewares=[json_errors, authenticate], client_max_size=gateway.max_body_bytes)
    app[GATEWAY_KEY] = gateway
    runs.setup(app, gateway)
    agents.setup(app, gateway)
    system.setup(app, gateway)
    receipts.setup(app, gateway)
    metrics.setup(app, gateway)
    workspaces.setup(app, gateway)
    mcp_http.setup(app, gateway)
    preferences_routes.setup(app, gateway)
    plugins.register_routes(app, gateway)
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    return app
