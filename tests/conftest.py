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
- ``gateway_of(client)``: the :class:`agent_gateway.app.Gateway` behind a test client.

Helpers (plain functions, import them: ``from tests.conftest import run_to_end, sse_events``)
- ``sse_events(response)``: async generator of ``{"id", "event", "data"}`` dicts parsed from an
  aiohttp client response (``data`` is decoded JSON; comments / heartbeats are skipped).
- ``run_to_end(client, body, headers=None)``: POST the run, stream it to its terminal event,
  return ``(receipt, events)``.
- ``read_stream(client, run_id, ...)``: collect a run's SSE events until the stream closes.
- ``events_page(client, run_id, ...)``: every event of a run through the JSON pages.
Every wait is bounded (``WAIT`` seconds unless told otherwise).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent_gateway.app import GATEWAY_KEY, Gateway, create_app
from agent_gateway.config import Config
from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.plugin_host import PluginHost
from agent_gateway.testing.fake_openai import FakeOpenAI

POSTGRES_URL = os.environ.get("AG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
STORAGES = ("sqlite", "postgres")
# The longest any single wait in these tests may take.
WAIT = 20.0

MakeGateway = Callable[..., Awaitable[TestClient]]


# -- agents run as another user --------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _tmp_path_readable_by_agents(request: pytest.FixtureRequest) -> None:
    """Where the tests run as root, confined agents run as an unprivileged user: a script or
    state folder a test writes into its ``tmp_path`` (pytest makes it 0700) must be readable by
    it, as an agent's install is."""
    if "tmp_path" in request.fixturenames:
        os.chmod(request.getfixturevalue("tmp_path"), 0o755)


# -- SSE and run helpers ---------------------------------------------------------------------------


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Parse an SSE response into ``{"id": str | None, "event": str, "data": Any}`` dicts.

    Multi-line ``data:`` fields are joined with newlines; ``data`` is JSON-decoded when it parses.
    Comment lines (``: ping``) are skipped. Ends when the server closes the stream."""
    event_id: str | None = None
    kind = "message"
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    value: Any = json.loads(text)
                except ValueError:
                    value = text
                yield {"id": event_id, "event": kind, "data": value}
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value_text = line.partition(":")
        value_text = value_text.removeprefix(" ")
        if name == "id":
            event_id = value_text
        elif name == "event":
            kind = value_text
        elif name == "data":
            data.append(value_text)


def stream_path(run_id: str, after: str | None = None) -> str:
    return f"/v1/runs/{run_id}/stream" + (f"?afterSeq={after}" if after is not None else "")


async def read_stream(
    client: TestClient,
    run_id: str,
    *,
    after: str | None = None,
    last_event_id: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = WAIT,
) -> list[dict[str, Any]]:
    """Every SSE event of one stream request, until the server closes it (bounded by timeout)."""
    all_headers = dict(headers or {})
    if last_event_id is not None:
        all_headers["Last-Event-ID"] = last_event_id
    events = []
    async with asyncio.timeout(timeout):
        async with client.get(stream_path(run_id, after), headers=all_headers) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "text/event-stream"
            async for event in sse_events(response):
                events.append(event)
    return events


async def run_to_end(
    client: TestClient,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    timeout: float = WAIT,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """POST a run, stream it until its terminal event; return (creation receipt, SSE events).

    Asserts the stream ends with exactly one terminal event and closes after it."""
    response = await client.post("/v1/runs", json=body, headers=headers or {})
    assert response.status in (200, 201), await response.text()
    receipt = await response.json()
    events = await read_stream(client, receipt["hostRunId"], headers=headers, timeout=timeout)
    assert events, "the stream closed without any event"
    assert events[-1]["event"] in TERMINAL_KINDS, [e["event"] for e in events]
    assert sum(e["event"] in TERMINAL_KINDS for e in events) == 1
    return receipt, events


async def events_page(
    client: TestClient, run_id: str, headers: dict[str, str] | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """Every event of a run through `GET /events`, following nextCursor."""
    out: list[dict[str, Any]] = []
    cursor = "0"
    while True:
        response = await client.get(
            f"/v1/runs/{run_id}/events", params={"afterSeq": cursor, "limit": str(limit)}, headers=headers or {}
        )
        assert response.status == 200, await response.text()
        page = await response.json()
        out.extend(page["events"])
        if not page["events"]:
            return out
        cursor = page["nextCursor"]


def run_body(message: str = "hello", **fields: Any) -> dict[str, Any]:
    """A valid chat-only run body with a fresh requestId and sessionId (override any field)."""
    body: dict[str, Any] = {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": "chat-only",
        "sessionId": "s-" + uuid.uuid4().hex[:10],
        "workspaceId": "local:test",
        "message": message,
    }
    body.update(fields)
    return body


def gateway_of(client: TestClient) -> Gateway:
    return client.app[GATEWAY_KEY]  # type: ignore[index]


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


def postgres_url_for_schema(schema: str) -> str:
    """The storage URL whose connections use `schema` as their search_path."""
    joiner = "&" if "?" in POSTGRES_URL else "?"
    return f"{POSTGRES_URL}{joiner}options=-csearch_path%3D{schema}"


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
