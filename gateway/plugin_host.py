"""A typed facade over the pluggy plugin manager: core code asks this, never `pm.hook`.

Environment switches (read when plugins are loaded):
- ``AGENT_GATEWAY_LOAD_PLUGINS=a,b``: load only these entry-point names (empty: load none).
- ``AGENT_GATEWAY_TRACE_HOOKS=1``: log every hook call and result to stderr.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from agent_gateway.hookspecs import PROJECT_NAME, SPEC_MODULES

log = logging.getLogger("agent_gateway.plugin_host")

ENTRY_POINT_GROUP = PROJECT_NAME
LOAD_ENV = "AGENT_GATEWAY_LOAD_PLUGINS"
TRACE_ENV = "AGENT_GATEWAY_TRACE_HOOKS"


class PluginError(Exception):
    """A plugin could not be loaded or broke the contract."""


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
    def load(cls, env: Mapping[str, str] | None = None, extra: tuple[object, ...] = ()) -> PluginHost:
        """Load plugins from the ``agent_gateway`` entry-point group, plus ``extra`` objects
        (tests register plugins this way)."""
        env = os.environ if env is None else env
        pm = pluggy.PluginManager(PROJECT_NAME)
        for module in SPEC_MODULES:
            pm.add_hookspecs(module)
        host = cls(pm)
        wanted = env.get(LOAD_ENV)
        allowed = None if wanted is None else {n.strip() for n in wanted.split(",") if n.strip()}
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            if pm.get_plugin(ep.name) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must name itself
                raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}") from exc
            _register(pm, plugin, ep.name)
            dist = getattr(ep, "dist", None)
            host._dists[ep.name] = (dist.name if dist else None, dist.version if dist else None)
        for plugin in extra:
            _register(pm, plugin, None)
        _check_pending(pm)
        if env.get(TRACE_ENV, "") not in ("", "0"):
            host.enable_tracing()
        return host

    def enable_tracing(self) -> None:
        def before(hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
            names = ", ".join(self.pm.get_name(i.plugin) or "?" for i in impls)
            print(f"[hook] {hook_name}({', '.join(kwargs)}) -> {names}", file=sys.stderr)

        def after(outcome: Any, hook_name: str, impls: list[Any], kwargs: dict[str, Any]) -> None:
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
    def _collect(self, hook: Callable[..., Any], **kwargs: Any) -> list[Any]:
        items: list[Any] = []
        hook(register=items.append, **kwargs)
        return items

    def runtimes(self, config: Any) -> list[Any]:
        return self._collect(self.pm.hook.register_runtimes, config=config)

    def negotiate_runtime_policy(self, agent_id: str, policy: Any, initialize_result: dict[str, Any]) -> None:
        self.pm.hook.negotiate_runtime_policy(agent_id=agent_id, policy=policy, initialize_result=initialize_result)

    def session_strategy(self, runtime: Any, config: Any) -> Any:
        return self.pm.hook.session_strategy(runtime=runtime, config=config)

    def tools(self, config: Any) -> list[Any]:
        return self._collect(self.pm.hook.register_tools, config=config)

    def tool_call_veto(self, call: Any) -> str | None:
        return self.pm.hook.tool_call_veto(call=call)

    def tool_call_completed(self, call: Any, receipt: dict[str, Any]) -> None:
        self.pm.hook.tool_call_completed(call=call, receipt=receipt)

    def storage_backend(self, url: str, config: Any) -> Any:
        return self.pm.hook.storage_backend(url=url, config=config)

    def projections(self) -> dict[str, Callable[[Any], Any]]:
        found: dict[str, Callable[[Any], Any]] = {}

        def register(name: str, project: Callable[[Any], Any]) -> None:
            found.setdefault(name, project)  # first registered (the overriding plugin) wins

        self.pm.hook.register_projections(register=register)
        return found

    def config_sections(self) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        sections: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.pm.hook.config_sections(register=lambda *a, **kw: sections.append((a, kw)))
        return sections

    def register_routes(self, app: Any, gateway: Any) -> None:
        self.pm.hook.register_routes(app=app, gateway=gateway)

    def setting_fields(self, config: Any) -> list[Any]:
        return self._collect(self.pm.hook.register_setting_fields, config=config)

    def register_commands(self, cli: Any) -> None:
        self.pm.hook.register_commands(cli=cli)

    async def startup(self, app: Any) -> None:
        for result in self.pm.hook.gateway_startup(app=app):
            if inspect.isawaitable(result):
                await result

    async def shutdown(self, app: Any) -> None:
        for result in self.pm.hook.gateway_shutdown(app=app):
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


def plugin_module_name(plugin: ModuleType | object) -> str:
    return getattr(plugin, "__name__", type(plugin).__name__)
