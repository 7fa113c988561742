"""Plugin configuration sections and launcher commands."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    import click

    from agent_gateway.config import Validator
    from agent_gateway.lifecycle import GatewayContext


class RegisterSection(Protocol):
    """The ``register`` argument of :func:`config_sections`."""

    def __call__(
        self, name: str, defaults: dict[str, Any], validate: Validator | None = None, doc: str = ""
    ) -> None: ...


@hookspec
def config_sections(register: RegisterSection) -> None:
    """Declare configuration sections.

    Call ``register(name, defaults, validate=None, doc="")``: ``defaults`` is a dict of every
    key with its default value (its type is the expected type); ``validate(section)`` may return
    a list of ``(key, problem)`` pairs for problems beyond types. Unknown keys and wrong types
    are reported by ``agent-gateway config check`` as ``file: section.key: problem``; the
    section is then read with :meth:`agent_gateway.Config.section`.
    Called when configuration is loaded, before anything else.
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add commands to the ``agent-gateway`` click group ``cli``. Called when the launcher starts."""


@hookspec
def gateway_startup(context: GatewayContext) -> Awaitable[None] | None:
    """The gateway is starting (storage open, interrupted runs recovered).

    ``context`` is an :class:`agent_gateway.GatewayContext`: ``config``, ``data_dir``,
    ``base_url`` and ``state``, a dict kept for ``gateway_shutdown`` (the same context object).
    Return nothing, or an awaitable the core awaits (for example to start a watcher).
    """


@hookspec
def gateway_shutdown(context: GatewayContext) -> Awaitable[None] | None:
    """The gateway is stopping (runs stopped, runtimes closed; storage still open). ``context`` is
    the one ``gateway_startup`` got. Return nothing, or an awaitable the core awaits."""
