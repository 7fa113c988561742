"""A typed facade over the pluggy plugin manager: core code asks this, never `pm.hook`.

Built-in plugins (the entry points of the ``agent-gateway`` distribution itself: ``core``,
``journal_peewee``, ``chat_only``, ...) always load. Environment switches (read when plugins are
loaded):
- ``AGENT_GATEWAY_LOAD_PLUGINS=a,b``: load only these *third-party* entry-point names (empty: no
  third-party plugin). Unset: every installed plugin.
- ``AGENT_GATEWAY_TRACE_HOOKS=1``: log every hook call and result to stderr.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy
from pluggy import HookCaller, HookImpl, Result

from agent_gateway.errors import PluginError
from agent_gateway.hookspecs import PROJECT_NAME, SPEC_MODULES
from agent_gateway.hookspecs.projection import Projection

if TYPE_CHECKING:
    import click
    from aiohttp import web

    from agent_gateway.auth import Actor
    from agent_gateway.cluster import Coordinator
    from agent_gateway.config import Config
    from agent_gateway.lifecycle import GatewayContext
    from agent_gateway.models import Run
    from agent_gateway.plugin_routes import PluginRoutes
    from agent_gateway.runtime import Runtime, RuntimePolicy
    from agent_gateway.sandbox import AgentLaunch
    from agent_gateway.sessions import SessionStrategy
    from agent_gateway.storage import Storage
    from agent_gateway.telemetry import RunTrace
    from agent_gateway.tools import Tool, ToolCall

log = logging.getLogger("agent_gateway.plugin_host")

__all__ = ["PluginError", "PluginHost", "PluginInfo"]

ENTRY_POINT_GROUP = PROJECT_NAME
# The distribution whose entry points are the built-in plugins (compared normalised, PEP 503).
BUILTIN_DISTRIBUTION = "agent-gateway"
LOAD_ENV = "AGENT_GATEWAY_LOAD_PLUGINS"
TRACE_ENV = "AGENT_GATEWAY_TRACE_HOOKS"


@dataclass(frozen=True)
class PluginInfo:
    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...]


class PluginHost:
    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        self._dists: dict[str, tuple[str | None, str | None]] = {}

    # -- loading ----------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        env: Mapping[str, str] | None = None,
        extra: tuple[object, ...] = (),
        *,
        builtins: bool | Collection[str] = True,
    ) -> PluginHost:
        """Load plugins from the ``agent_gateway`` entry-point group, plus ``extra`` objects
        (tests register plugins this way).

        Built-in plugins always load unless ``builtins`` says otherwise: False loads none of
        them, a collection of names loads only those (tests that want a bare or partial host).
        ``AGENT_GATEWAY_LOAD_PLUGINS`` in ``env`` filters third-party plugins only."""
        env = os.environ if env is None else env
        pm = pluggy.PluginManager(PROJECT_NAME)
        for module in SPEC_MODULES:
            pm.add_hookspecs(module)
        host = cls(pm)
        wanted = env.get(LOAD_ENV)
        third_party = None if wanted is None else {n.strip() for n in wanted.split(",") if n.strip()}
        # The entry points of one distribution share its Distribution object: its metadata is
        # read once, not twice per plugin (that was a tenth of the CLI's start-up).
        identities: dict[int, tuple[str | None, str | None]] = {}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            if id(dist) not in identities:
                identities[id(dist)] = _identity(dist)
            identity = identities[id(dist)]
            if is_builtin(ep, identity[0]):
                if builtins is False or (builtins is not True and ep.name not in builtins):
                    continue
            elif third_party is not None and ep.name not in third_party:
                continue
            if pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must name itself
                origin = f"{identity[0]} {identity[1]}" if dist is not None else "an unknown distribution"
                raise PluginError(
                    f"plugin {ep.name!r} ({ep.value}, from {origin}) failed to import: "
                    f"{type(exc).__name__}: {one_line(str(exc))}"
                ) from exc
            _register(pm, plugin, ep.name)
            host._dists[ep.name] = identity
        for plugin in extra:
            _register(pm, plugin, None)
        _check_pending(pm)
        if env.get(TRACE_ENV, "") not in ("", "0"):
            host.enable_tracing()
        return host

    def enable_tracing(self) -> None:
        def before(hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, object]) -> None:
            names = ", ".join(self.pm.get_name(i.plugin) or "?" for i in impls)
            print(f"[hook] {hook_name}({', '.join(kwargs)}) -> {names}", file=sys.stderr)

        def after(
            outcome: Result[object], hook_name: str, impls: Sequence[HookImpl], kwargs: Mapping[str, object]
        ) -> None:
            print(f"[hook] {hook_name} returned {outcome.get_result()!r:.200}", file=sys.stderr)

        self.pm.add_hookcall_monitoring(before, after)

    def register(self, plugin: object, name: str | None = None) -> None:
        _register(self.pm, plugin, name)
        try:
            _check_pending(self.pm)
        except PluginError:
            self.pm.unregister(plugin)
            raise

    def plugins(self) -> list[PluginInfo]:
        infos = []
        for name, plugin in sorted(self.pm.list_name_plugin(), key=lambda p: str(p[0])):
            if plugin is None:
                continue
            hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
            dist, version = self._dists.get(name, (None, None))
            infos.append(PluginInfo(str(name), dist, version, hooks))
        return infos

    # -- hook calls, one typed method per hook -------------------------------------------------
    def _collect(self, hook: HookCaller, **kwargs: object) -> list[Any]:
        items: list[Any] = []
        hook(register=items.append, **kwargs)
        return items

    def runtimes(self, config: Config) -> list[Runtime]:
        return self._collect(self.pm.hook.register_runtimes, config=config)

    def negotiate_runtime_policy(self, agent_id: str, policy: RuntimePolicy, initialize_result: dict[str, Any]) -> None:
        self.pm.hook.negotiate_runtime_policy(agent_id=agent_id, policy=policy, initialize_result=initialize_result)

    def session_strategy(self, runtime: Runtime, config: Config | None) -> SessionStrategy | None:
        strategy: SessionStrategy | None = self.pm.hook.session_strategy(runtime=runtime, config=config)
        return strategy

    def sandbox_agent(self, launch: AgentLaunch) -> Any:
        """A :class:`agent_gateway.SandboxedCommand` (or an awaitable of one), a
        :class:`agent_gateway.SandboxUnavailable`, or None when no plugin confines agents."""
        return self.pm.hook.sandbox_agent(launch=launch)

    def tools(self, config: Config) -> list[Tool]:
        return self._collect(self.pm.hook.register_tools, config=config)

    def tool_call_veto(self, call: ToolCall) -> str | None:
        reason: str | None = self.pm.hook.tool_call_veto(call=call)
        return reason

    def tool_call_completed(self, call: ToolCall, receipt: dict[str, Any]) -> None:
        self.pm.hook.tool_call_completed(call=call, receipt=receipt)

    def trace_run(self, run: Run, agent_name: str, headers: Mapping[str, str], config: Config) -> RunTrace | None:
        trace: RunTrace | None = self.pm.hook.trace_run(run=run, agent_name=agent_name, headers=headers, config=config)
        return trace

    def storage_backend(self, url: str, config: Config | None) -> Storage | None:
        storage: Storage | None = self.pm.hook.storage_backend(url=url, config=config)
        return storage

    def cluster_coordinator(self, config: Config) -> Coordinator | None:
        coordinator: Coordinator | None = self.pm.hook.cluster_coordinator(config=config)
        return coordinator

    def projections(self) -> dict[str, Projection]:
        found: dict[str, Projection] = {}

        def register(name: str, project: Projection) -> None:
            found.setdefault(name, project)  # first registered (the overriding plugin) wins

        self.pm.hook.register_projections(register=register)
        return found

    def config_sections(self) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """Each ``register(...)`` call's positional and keyword arguments, in call order."""
        sections: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.pm.hook.config_sections(register=lambda *a, **kw: sections.append((a, kw)))
        return sections

    def register_routes(self, routes: PluginRoutes) -> None:
        self.pm.hook.register_routes(routes=routes)

    def setting_fields(self, config: Config) -> list[dict[str, Any]]:
        return self._collect(self.pm.hook.register_setting_fields, config=config)

    def register_commands(self, cli: click.Group) -> None:
        self.pm.hook.register_commands(cli=cli)

    def authenticate(self, request: web.Request, config: Config) -> Any:
        """The first plugin's :class:`agent_gateway.Actor` for ``request`` (or an awaitable of one),
        or None when no plugin vouches for it."""
        return self.pm.hook.authenticate(request=request, config=config)

    def authentication_required(self, config: Config) -> bool:
        """True when some ``authenticate`` implementation is in use: one whose plugin says so
        (``authentication_enabled``), or one whose plugin does not say."""
        answering = {impl.plugin for impl in self.pm.hook.authentication_enabled.get_hookimpls()}
        if any(impl.plugin not in answering for impl in self.pm.hook.authenticate.get_hookimpls()):
            return True
        return any(self.pm.hook.authentication_enabled(config=config))

    def authorizes(self) -> bool:
        """True when a plugin implements ``authorize`` (checked once: without one, nothing asks)."""
        return bool(self.pm.hook.authorize.get_hookimpls())

    async def authorize(self, actor: Actor, action: str, resource: dict[str, Any]) -> bool:
        """Every ``authorize`` answer (awaited where awaitable): False if any denies, else True."""
        allowed = True
        for answer in self.pm.hook.authorize(actor=actor, action=action, resource=resource):
            if inspect.isawaitable(answer):
                answer = await answer
            if answer is False:
                allowed = False
        return allowed

    async def startup(self, context: GatewayContext) -> None:
        for result in self.pm.hook.gateway_startup(context=context):
            if inspect.isawaitable(result):
                await result

    async def shutdown(self, context: GatewayContext) -> None:
        for result in self.pm.hook.gateway_shutdown(context=context):
            if inspect.isawaitable(result):
                await result


def _register(pm: pluggy.PluginManager, plugin: object, name: str | None) -> None:
    """Register one plugin; a hook implementation whose arguments the spec does not have is a
    PluginError naming the plugin. An unnamed object is named after its class (traces, listings)."""
    if name is None and not hasattr(plugin, "__name__"):
        name = f"{type(plugin).__name__}@{id(plugin):x}"
    try:
        pm.register(plugin, name=name)
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {name or plugin_module_name(plugin)!r} breaks the hook contract: {exc}") from exc


def _check_pending(pm: pluggy.PluginManager) -> None:
    """Reject implementations of hooks no spec declares (a typo, or a hook of another version)."""
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"unknown hook implemented: {exc}") from exc


def is_builtin(ep: metadata.EntryPoint, distribution: str | None = None) -> bool:
    """True for an entry point of the ``agent-gateway`` distribution itself (``distribution``:
    its distribution's name, when already read)."""
    dist = getattr(ep, "dist", None)
    if dist is None:  # no metadata to go by: our own modules are built-ins
        return ep.value.split(":", 1)[0].startswith(f"{PROJECT_NAME}.")
    name = distribution if distribution is not None else dist.name
    return re.sub(r"[-_.]+", "-", name).lower() == BUILTIN_DISTRIBUTION


def _identity(dist: metadata.Distribution | None) -> tuple[str | None, str | None]:
    """A distribution's name and version from one read of its metadata (``dist.name`` and
    ``dist.version`` each read and parse the whole METADATA file, ours with the README in it)."""
    if dist is None:
        return None, None
    meta = dist.metadata
    return meta["Name"], meta["Version"]


def one_line(text: str) -> str:
    """``text`` on one line (launcher errors are one line)."""
    return " ".join(text.split())


def plugin_module_name(plugin: ModuleType | object) -> str:
    return getattr(plugin, "__name__", type(plugin).__name__)
