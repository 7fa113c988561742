"""Shared fixtures and helpers for the gateway's tests.

Fixtures
- ``fake_llm``: a started :class:`agent_gateway.testing.fake_openai.FakeOpenAI` (echo by default); script it
  with ``fake_llm.add(Reply(...))`` or ``fake_llm.default = ...``; stopped at teardown.
- ``make_gateway``: ``await make_gateway(overrides={}, storage="sqlite", tokens=None,
  extra_plugins=(), data_dir=None, schema=None)`` returns an ``aiohttp.test_utils.TestClient`` on a
  real ``TestServer`` running ``create_app(...)``. ``gateway.data_dir`` is a fresh tmp dir and
  ``chat_only.base_url`` is the ``fake_llm`` URL unless ``overrides`` says otherwise.
  ``storage="postgres"`` uses the real PostgreSQL (``AG_TEST_POSTGRES_URL``, default
  ``postgresql://postgres@127.0.0.1:5432/test``) with the tables in a fresh schema of their own,
  selected through the URL (``?options=-csearch_path%3D<schema>``) and dropped at teardown. Pass the
  same ``data_dir`` (and ``schema``) again to start a second gateway on the same data.
  Every client is closed at teardown.
- ``storage_kind``: parametrizes a test over ``"sqlite"`` and ``"postgres"``.

Helpers (plain functions) live in ``tests/_harness.py`` (``from tests._harness import run_to_end``):
``sse_events``, ``run_to_end``, ``read_stream``, ``events_page``, ``run_body``, ``gateway_of``.
Nothing imports this module: pytest loads it, and test modules import helper modules only
(``tests/_*.py``, ``agent_gateway.testing``), never each other (tests/test_suite_layout.py).
Every wait is bounded (``WAIT`` seconds unless told otherwise).
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import tests._harness
from agent_gateway.app import create_app
from agent_gateway.config import Config
from agent_gateway.plugin_host import PluginHost
from agent_gateway.testing.fake_openai import FakeOpenAI
from tests._harness import (
    POSTGRES_URL,
    STORAGES,
    MakeGateway,
    postgres_url_for_schema,
)

# -- agents run as another user --------------------------------------------------------------------


# -- markers ----------------------------------------------------------------------------------------
# Registered in setup.cfg ([tool:pytest] markers, --strict-markers). `peers` and `browser` are set
# on the modules and tests themselves (and checked when a peer starts: tests._harness.require_mark);
# `postgres` is also added here to every test that opens a PostgreSQL schema through a fixture.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        on_postgres = "postgres_admin" in fixtures or (
            callspec is not None and callspec.params.get("storage_kind") == "postgres"
        )
        if on_postgres and item.get_closest_marker("postgres") is None:
            item.add_marker(pytest.mark.postgres)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection imported (every test module and the libraries they use, about 290,000
    objects) out of the collector's reach. A gateway collects garbage after its runs end
    (`agent_gateway.server.allocator`), and a full collection walks every tracked object: in a
    test process that heap is the suite's, not the gateway's, and each collection cost ~0.15 s of
    CPU. Frozen objects live as long as the process anyway; what a test creates is collected as
    before, so the garbage tests (tests/test_run_garbage.py) see the same cycles."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """After a module's last test (its fixtures torn down), free its garbage and freeze what
    survives (libraries a test imported late, caches): the collections the gateways make in the
    next module then walk only that module's objects."""
    result = yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    tests._harness.current_item = item


@pytest.fixture(autouse=True)
def _tmp_path_readable_by_agents(request: pytest.FixtureRequest) -> None:
    """Where the tests run as root, confined agents run as an unprivileged user: a script or
    state folder a test writes into its ``tmp_path`` (pytest makes it 0700) must be readable by
    it, as an agent's install is."""
    if "tmp_path" in request.fixturenames:
        os.chmod(request.getfixturevalue("tmp_path"), 0o755)


# -- SSE and run helpers ---------------------------------------------------------------------------


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeOpenAI]:
    """A started fake OpenAI-compatible upstream that echoes unless scripted."""
    fake = FakeOpenAI()
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture(params=STORAGES)
def storage_kind(request: pytest.FixtureRequest) -> str:
    """Run the test once on SQLite and once on the real PostgreSQL."""
    return str(request.param)


@pytest.fixture(scope="session")
def postgres_admin() -> Any:
    """An autocommit psycopg2 connection for creating and dropping test schemas (session-wide)."""
    import psycopg2

    try:
        conn = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
    except psycopg2.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required and unreachable at {POSTGRES_URL}: {exc}", pytrace=False)
    conn.autocommit = True
    yield conn
    conn.close()


def _merge(base: dict[str, dict[str, Any]], extra: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    merged = {section: dict(values) for section, values in base.items()}
    for section, values in extra.items():
        merged.setdefault(section, {}).update(values)
    return merged


@pytest.fixture
async def make_gateway(
    request: pytest.FixtureRequest, fake_llm: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[MakeGateway]:
    """Factory for gateways on real test servers; see the module docstring."""
    clients: list[TestClient] = []
    schemas: list[str] = []

    async def factory(
        overrides: dict[str, dict[str, Any]] | None = None,
        storage: str = "sqlite",
        tokens: dict[str, str] | None = None,
        extra_plugins: tuple[object, ...] = (),
        data_dir: Path | str | None = None,
        schema: str | None = None,
    ) -> TestClient:
        if storage not in STORAGES:
            raise ValueError(f"storage must be one of {STORAGES}, not {storage!r}")
        directory = Path(data_dir) if data_dir is not None else tmp_path_factory.mktemp("gateway")
        base: dict[str, dict[str, Any]] = {
            "gateway": {"data_dir": str(directory)},
            "chat_only": {"base_url": fake_llm.base_url, "model": "m"},
        }
        if storage == "postgres":
            admin = request.getfixturevalue("postgres_admin")
            if schema is None:
                schema = f"ag_gw_{uuid.uuid4().hex[:12]}"
            if schema not in schemas:
                with admin.cursor() as cur:
                    cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                schemas.append(schema)
            base["storage"] = {"url": postgres_url_for_schema(schema)}
        if tokens is not None:
            base["auth"] = {"tokens": dict(tokens)}
        config = Config.load(None, env={}, overrides=_merge(base, overrides or {}))
        plugins = PluginHost.load(env={}, extra=tuple(extra_plugins))
        app = create_app(config, plugins)
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        client.schema = schema  # type: ignore[attr-defined]  # reuse it for a second gateway
        return client

    try:
        yield factory
    finally:
        for client in reversed(clients):
            await client.close()
        if schemas:
            admin = request.getfixturevalue("postgres_admin")
            with admin.cursor() as cur:
                for name in schemas:
                    cur.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
