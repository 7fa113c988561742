"""Storage family: where runs, events, sessions, preferences and receipts live."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.storage import Storage


@hookspec(firstresult=True)
def storage_backend(url: str, config: Config) -> Storage | None:
    """Return an :class:`agent_gateway.Storage` for ``url`` (from ``[storage] url``), or None if
    this plugin does not handle that URL scheme. Raise :class:`agent_gateway.PluginError` with a
    one-line reason (e.g. a missing driver and the package to install) when it handles the scheme
    but cannot serve it here.

    First non-None result wins; the built-in peewee journal is ``trylast`` so a plugin can
    replace it. Called once at start-up (and by ``agent-gateway config check``); the core then
    calls ``open()``.
    """
