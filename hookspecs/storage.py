"""Storage family: where runs, events, sessions, preferences and receipts live."""

from __future__ import annotations

from typing import Any

from agent_gateway.hookspecs import hookspec


@hookspec(firstresult=True)
def storage_backend(url: str, config: Any) -> Any:
    """Return a :class:`gateway.storage.Storage` for ``url`` (from ``[storage] url``), or None if
    this plugin does not handle that URL scheme.

    First non-None result wins; the built-in peewee journal is ``trylast`` so a plugin can
    replace it. Called once at start-up; the core then calls ``open()``.
    """
