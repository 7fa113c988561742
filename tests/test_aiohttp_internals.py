"""The HTTP server relies on aiohttp internals (``AIOHTTP_INTERNALS`` in its module): each exists
on the installed aiohttp, setup.cfg pins aiohttp to the series they were checked on, and a server
on an aiohttp that lacks one refuses to start, naming it."""

from __future__ import annotations

import configparser
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from agent_gateway.server import http_server
from agent_gateway.server.http_server import (
    AIOHTTP_INTERNALS,
    AIOHTTP_TESTED,
    GatewayRunner,
    GuardedTCPSite,
    missing_aiohttp_internals,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def runner() -> AsyncIterator[GatewayRunner]:
    runner = GatewayRunner(web.Application())
    try:
        await runner.setup()
        yield runner
    finally:
        await runner.cleanup()


async def test_every_aiohttp_internal_the_server_relies_on_exists(runner: GatewayRunner) -> None:
    """Looked up on live objects, as the server uses them: a request handler, the server, the
    runner, a site and a response."""
    server = runner.server
    assert server is not None
    handler = server()
    site = GuardedTCPSite(runner, "127.0.0.1", 0)
    response = web.StreamResponse()
    missing = missing_aiohttp_internals(handler, server, runner, site, response)
    assert not missing, "\n".join(missing)
    checked = {cls for cls, _ in AIOHTTP_INTERNALS}
    assert all(any(isinstance(obj, cls) for obj in (handler, server, runner, site, response)) for cls in checked)


def test_setup_cfg_pins_aiohttp_to_the_tested_series() -> None:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    requirements = [Requirement(line) for line in parser["options"]["install_requires"].splitlines() if line.strip()]
    [pin] = [r for r in requirements if r.name == "aiohttp"]
    assert pin.specifier == SpecifierSet(AIOHTTP_TESTED), f"setup.cfg says {pin}, http_server.py {AIOHTTP_TESTED}"
    assert aiohttp.__version__ in pin.specifier, f"aiohttp {aiohttp.__version__} is installed, outside {pin}"


async def test_a_missing_internal_is_named_with_the_pin_and_the_server_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_server, "AIOHTTP_INTERNALS", (*AIOHTTP_INTERNALS, (RequestHandler, ("_gone",))))
    runner = GatewayRunner(web.Application())
    try:
        with pytest.raises(RuntimeError) as refused:
            await runner.setup()
    finally:
        await runner.cleanup()
    message = str(refused.value)
    assert message.startswith(f"aiohttp {aiohttp.__version__} has no RequestHandler._gone, "), message
    assert f"aiohttp{AIOHTTP_TESTED}" in message and "setup.cfg" in message, message
    assert message.count("has no") == 1, message
