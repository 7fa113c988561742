"""pytest fixtures for testing Agent Gateway plugins.

Installed with agent-gateway as the pytest plugin ``agent_gateway`` (the ``pytest11`` entry
point), so a plugin's own test suite has these fixtures without any import:

- ``agw_plugins`` — override it: the plugin objects or modules your tests load (besides every
  installed plugin, which loads as it does for ``agent-gateway serve``). Default: none.
- ``agw_config`` — override it: configuration overrides ``{section: {key: value}}``. The marker
  ``@pytest.mark.agw_config({...})`` (or ``agw_config(section={...})``) adds to it for one test,
  class or module.
- ``agw_gateway`` — a real gateway serving on 127.0.0.1:<free port> (its own event loop in a
  background thread), with SQLite under the test's ``tmp_path``; a
  :class:`~agent_gateway.testing.server.RunningGateway` (``url``, ``client()``, ``runtime(id)``).
  Stopped at teardown (your runtime's ``close()`` runs).
- ``agw_client`` — a :class:`~agent_gateway.testing.client.GatewayClient` for ``agw_gateway``:
  ``run(...)``, ``create_run``, ``stream``, ``events``, ``cancel``, ``agent``.
- ``agw_fake_upstream`` — a started :class:`~agent_gateway.testing.fake_openai.FakeOpenAI`, the
  scriptable OpenAI-compatible server (point your plugin at ``agw_fake_upstream.base_url``
  through ``agw_config``).

The fixtures are synchronous and bounded in time: they work in plain test functions and in
async ones under any event-loop plugin. Importing this module imports nothing but pytest; the
gateway is imported when a test first uses a fixture. See ``docs/testing-plugins.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agent_gateway.testing.client import GatewayClient
    from agent_gateway.testing.fake_openai import FakeOpenAI
    from agent_gateway.testing.server import RunningGateway

MARKER = "agw_config"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(overrides=None, **sections): configuration overrides {{section: {{key: value}}}} for "
        "agw_gateway, over the agw_config fixture (agent_gateway.testing)",
    )


def marker_overrides(node: pytest.Item) -> list[dict[str, dict[str, Any]]]:
    """The ``agw_config`` markers' overrides, outermost (module) first, the test's own last."""
    layers = []
    for mark in reversed(list(node.iter_markers(MARKER))):
        layer: dict[str, dict[str, Any]] = {}
        for overrides in mark.args:
            if not isinstance(overrides, dict):
                raise TypeError(f"@pytest.mark.{MARKER} takes a dict of sections, not {overrides!r}")
            layer.update(overrides)
        layer.update(mark.kwargs)
        layers.append(layer)
    return layers


@pytest.fixture
def agw_plugins() -> list[object]:
    """Override: the plugin objects or modules your tests load besides the installed ones."""
    return []


@pytest.fixture
def agw_config() -> dict[str, dict[str, Any]]:
    """Override: configuration overrides ``{section: {key: value}}`` for ``agw_gateway``."""
    return {}


@pytest.fixture
def agw_gateway(
    request: pytest.FixtureRequest,
    agw_plugins: list[object],
    agw_config: dict[str, dict[str, Any]],
    tmp_path: Path,
) -> Iterator[RunningGateway]:
    """A gateway serving on 127.0.0.1 with ``agw_plugins`` loaded and ``agw_config`` applied."""
    from agent_gateway.testing.server import merge_overrides, start_gateway

    overrides = merge_overrides(agw_config, *marker_overrides(request.node))
    with start_gateway(agw_plugins, overrides, data_dir=tmp_path / "agw-gateway") as running:
        yield running


@pytest.fixture
def agw_client(agw_gateway: RunningGateway) -> GatewayClient:
    """An HTTP/SSE client for ``agw_gateway``."""
    return agw_gateway.client()


@pytest.fixture
def agw_fake_upstream() -> Iterator[FakeOpenAI]:
    """A started fake OpenAI-compatible upstream (echoes unless scripted); stopped at teardown."""
    from agent_gateway.testing.fake_openai import FakeOpenAI

    fake = FakeOpenAI()
    fake.start_in_thread()
    try:
        yield fake
    finally:
        fake.stop_thread()
