"""A real gateway for tests: ``create_app`` served on 127.0.0.1:<free port> by its own event loop
in a background thread, with the plugins a test names, SQLite in a directory the test owns.

The loop runs in its own thread so the same gateway serves plain test functions, async tests
(whatever their event-loop plugin) and scripts, and a test's blocking client calls never stall
the server. Start it with :func:`start_gateway` (a context manager) or the ``agw_gateway`` pytest
fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agent_gateway.testing.client import DEFAULT_TIMEOUT, GatewayClient

if TYPE_CHECKING:
    from aiohttp import web

    from agent_gateway.app import Gateway
    from agent_gateway.config import Config
    from agent_gateway.plugin_host import PluginHost

T = TypeVar("T")
Overrides = Mapping[str, Mapping[str, Any]]
HOST = "127.0.0.1"


class LoopThread:
    """An event loop running forever in a daemon thread until :meth:`stop`: for synchronous code
    (plain tests, Hypothesis, Schemathesis) driving async code. :meth:`call` runs a coroutine on
    it and waits (bounded) for its result; :meth:`stop` cancels what is left and closes the loop."""

    def __init__(self, name: str = "agw-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            # Whatever a plugin left running ends with the loop, not in a warning at exit.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self, timeout: float) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)


@dataclass
class RunningGateway:
    """A gateway serving on ``url``. ``config``, ``plugins`` and ``app`` are the objects it runs
    on; :attr:`gateway` and :meth:`call` reach inside it (internal API: for checks the HTTP API
    cannot make)."""

    url: str
    data_dir: Path
    config: Config
    plugins: PluginHost
    app: web.Application
    _thread: LoopThread

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def gateway(self) -> Gateway:
        from agent_gateway.app import GATEWAY_KEY

        return self.app[GATEWAY_KEY]

    def runtime(self, agent_id: str) -> Any:
        """The runtime object registered for ``agent_id`` (your plugin's instance)."""
        return self.gateway.runtimes[agent_id]

    def client(self, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> GatewayClient:
        """A new HTTP/SSE client for this gateway."""
        return GatewayClient(self.url, token=token, timeout=timeout)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = DEFAULT_TIMEOUT) -> T:
        """Run ``coroutine`` on the gateway's event loop and return its result (from any thread
        but the gateway's own)."""
        return self._thread.call(coroutine, timeout)


def merge_overrides(*layers: Overrides | None) -> dict[str, dict[str, Any]]:
    """Section-wise merge: later layers win key by key."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in (layer or {}).items():
            merged.setdefault(section, {}).update(values)
    return merged


def load_plugins(plugins: Iterable[object], env: Mapping[str, str]) -> PluginHost:
    """The installed plugins (entry points, as ``agent-gateway serve`` loads them) plus
    ``plugins``; a plugin both installed and named here is registered once."""
    from agent_gateway.plugin_host import PluginHost

    host = PluginHost.load(env=env)
    for plugin in plugins:
        if not host.pm.is_registered(plugin):
            host.register(plugin)
    return host


# What problems name as the origin of a test's configuration overrides.
CONFIG_LABEL = "agw_config"


def load_config(
    overrides: Overrides | None, data_dir: Path, env: Mapping[str, str], plugins: PluginHost | None = None
) -> Config:
    """The default configuration with the data directory set, then ``overrides`` (in the place of
    a TOML file: problems name them ``agw_config``), then ``env``'s ``AGENT_GATEWAY__*``
    variables. With ``plugins``, their configuration sections are declared."""
    from agent_gateway.config import Config, section_specs_from_hook

    specs = section_specs_from_hook(plugins.config_sections()) if plugins is not None else None
    config = Config.load(None, specs, env=env)
    config.raw = merge_overrides({"gateway": {"data_dir": str(data_dir)}}, overrides)
    config.label = CONFIG_LABEL
    return config


def check_config(config: Config, plugins: PluginHost) -> None:
    """Raise :class:`agent_gateway.testing.ConfigError` listing every problem ``agent-gateway config
    check`` would report (an unknown section or key, a wrong type, what a section's validator
    refuses: your plugin's too), so a typo is not silently a test of the defaults."""
    from agent_gateway.config import ConfigError, check_problems

    problems = check_problems(config, plugins)
    if problems:
        raise ConfigError(["invalid configuration (as `agent-gateway config check` reports it):", *problems])


async def _serve(
    plugins: Iterable[object], overrides: Overrides | None, data_dir: Path, env: Mapping[str, str]
) -> tuple[web.AppRunner, Config, PluginHost, web.Application, str]:
    from aiohttp import web

    from agent_gateway.app import create_app

    host = load_plugins(plugins, env)
    config = load_config(overrides, data_dir, env, host)
    check_config(config, host)
    app = create_app(config, host)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    try:
        await runner.setup()  # the gateway's start-up: storage, journal, plugins' gateway_startup
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await runner.cleanup()
        raise
    port = int(runner.addresses[0][1])
    return runner, config, host, app, f"http://{HOST}:{port}"


@contextlib.contextmanager
def start_gateway(
    plugins: Iterable[object] = (),
    config: Overrides | None = None,
    *,
    data_dir: str | Path,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 60.0,
    shutdown_timeout: float = 60.0,
) -> Iterator[RunningGateway]:
    """Serve a gateway until the ``with`` block ends.

    ``plugins``: plugin objects or modules (``@hookimpl`` functions) loaded besides the installed
    ones. ``config``: ``{section: {key: value}}`` over the defaults (``gateway.data_dir`` is
    ``data_dir``; storage is SQLite there unless ``storage.url`` says otherwise). ``env``:
    what the gateway reads as its environment (``AGENT_GATEWAY__SECTION__KEY`` overrides,
    ``AGENT_GATEWAY_LOAD_PLUGINS``); the test process's own environment is never read, so a
    developer's shell cannot change what a test sees. A configuration with problems raises
    :class:`agent_gateway.testing.ConfigError` listing them all, as ``agent-gateway config check`` would
    report them; a plugin that fails to load, or a gateway that fails to start, raises here too."""
    directory = Path(data_dir)
    thread = LoopThread("agw-gateway")
    try:
        runner, loaded_config, host, app, url = thread.call(
            _serve(tuple(plugins), config, directory, dict(env or {})), startup_timeout
        )
        try:
            yield RunningGateway(url, directory, loaded_config, host, app, thread)
        finally:
            thread.call(runner.cleanup(), shutdown_timeout)  # runtimes' close(), storage closed
    finally:
        thread.stop(shutdown_timeout)
