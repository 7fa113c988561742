"""Plugin configuration sections and launcher commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_gateway.hookspecs import hookspec


@hookspec
def config_sections(register: Callable[..., None]) -> None:
    """Declare configuration sections.

    Call ``register(name, defaults, validate=None, doc="")``: ``defaults`` is a dict of every
    key with its default value (its type is the expected type); ``validate(section)`` may return
    a list of ``(key, problem)`` pairs for problems beyond types. Unknown keys and wrong types
    are reported by ``agent-gateway config check`` as ``file: section.key: problem``.
    Called when configuration is loaded, before anything else.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add commands to the ``agent-gateway`` click group ``cli``. Called when the launcher starts."""


@hookspec
def gateway_startup(app: Any) -> None:
    """The aiohttp app is starting; ``app`` is the :class:`aiohttp.web.Application`.

    Return nothing, or an awaitable the core awaits (for example to start a watcher).
    """


@hookspec
def gateway_shutdown(app: Any) -> None:
    """The app is stopping. Return nothing, or an awaitable the core awaits."""
