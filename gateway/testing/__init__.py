"""Test helpers for plugin authors: a running gateway with your plugin loaded, an HTTP/SSE client
and the scriptable fake upstream. As pytest fixtures they come from the ``agent_gateway`` pytest
plugin (``agent_gateway.testing.pytest_plugin``, registered through the ``pytest11`` entry point):
``agw_gateway``, ``agw_client``, ``agw_fake_upstream``, configured by overriding ``agw_plugins``
and ``agw_config``. See ``docs/testing-plugins.md``.

Names are resolved on first use, so pytest loading the plugin imports nothing heavy.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "start_gateway": "agent_gateway.testing.server",
    "RunningGateway": "agent_gateway.testing.server",
    "LoopThread": "agent_gateway.testing.server",
    "SseParser": "agent_gateway.testing.sse",
    "sse_events": "agent_gateway.testing.sse",
    "GatewayClient": "agent_gateway.testing.client",
    "GatewayHTTPError": "agent_gateway.testing.client",
    "RunResult": "agent_gateway.testing.client",
    "SseEvent": "agent_gateway.testing.sse",
    "FakeOpenAI": "agent_gateway.testing.fake_openai",
    "Reply": "agent_gateway.testing.fake_openai",
    "ConfigError": "agent_gateway.config",
}

__all__ = [  # noqa: RUF022  (grouped as _EXPORTS is)
    "start_gateway",
    "RunningGateway",
    "LoopThread",
    "SseParser",
    "sse_events",
    "GatewayClient",
    "GatewayHTTPError",
    "RunResult",
    "SseEvent",
    "FakeOpenAI",
    "Reply",
    "ConfigError",
]

if TYPE_CHECKING:
    from agent_gateway.config import ConfigError
    from agent_gateway.testing.client import GatewayClient, GatewayHTTPError, RunResult
    from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
    from agent_gateway.testing.server import LoopThread, RunningGateway, start_gateway
    from agent_gateway.testing.sse import SseEvent, SseParser, sse_events


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_gateway.testing' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
