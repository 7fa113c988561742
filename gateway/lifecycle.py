"""What the ``gateway_startup`` / ``gateway_shutdown`` hooks hand a plugin: a small, documented
context (docs/hooks.md), never the aiohttp application or the gateway object."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_gateway.config import Config


@dataclass
class GatewayContext:
    """The gateway a plugin starts and stops with.

    ``config`` is the loaded configuration (read a section with ``config.section(name)``),
    ``data_dir`` the gateway's data directory (``[gateway] data_dir``), ``state`` a dict the
    plugin may keep things in from ``gateway_startup`` to ``gateway_shutdown`` (the same object is
    handed to both; use keys named after the plugin). :attr:`base_url` is the gateway's own URL,
    None while it is not known yet."""

    config: Config
    data_dir: Path
    state: dict[str, Any] = field(default_factory=dict)
    _base_url: Callable[[], str | None] = field(default=lambda: None, repr=False)

    @property
    def base_url(self) -> str | None:
        """The gateway's own URL (``[gateway] public_url``, else the listening address once
        known), None while unknown."""
        return self._base_url()
