"""Storage survives its database (issue 12, item 1), against the real PostgreSQL.

- The server drops the gateway's idle connections (``pg_terminate_backend``, as a restart or a
  failover does): the next requests succeed on fresh connections.
- It drops them mid-run, mid-commit: the run completes, every event is stored exactly once, and a
  commit that failed is counted in ``agent_gateway_journal_commit_errors_total``.
- The database is unreachable (the gateway talks to it through a TCP proxy the test cuts; the
  shared server itself is never stopped): readiness is 503 ``degraded`` while liveness stays 200,
  ``POST /v1/runs`` is a 503 ``storage_unavailable`` JSON error, a running run's events wait in
  the spool, and once the proxy is back they are committed and readiness is 200 again.

Only backends whose ``application_name`` is this test's own are terminated: other tests (and other
people) use the same server. Every wait polls an observable condition, bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg2
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.app import Gateway
from agent_gateway.models import Event, parse_cursor
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from tests._harness import (
    POSTGRES_URL,
    WAIT,
    MakeGateway,
    ScriptPlugin,
    Step,
    events_page,
    gateway_of,
    metric,
    parse_prometheus,
    postgres_url_for_schema,
    read_stream,
    run_body,
    run_to_end,
    script_body,
)

# -- helpers ----------------------------------------------------------------------------------------


async def poll(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT) -> None:
    """Wait until `condition()` is true, checking every 20 ms, failing after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        # The conditions are outside this loop (PostgreSQL's activity, HTTP answers): polled.
        while not await condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert await condition(), what


def app_name() -> str:
    return f"ag_outage_{uuid.uuid4().hex[:12]}"


def storage_url(schema: str, application_name: str, host: str = "", port: int = 0) -> str:
    """The gateway's storage URL: tables in `schema`, connections named `application_name`,
    optionally through another host and port (the proxy)."""
    url = f"{postgres_url_for_schema(schema)}&application_name={application_name}"
    if host:
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        url = parts._replace(netloc=f"{user}@{host}:{port}" if user else f"{host}:{port}").geturl()
    return url


def terminate(admin: Any, application_name: str, where: str = "TRUE") -> list[int]:
    """pg_terminate_backend every backend named `application_name` (and matching `where`); the pids."""
    with admin.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid() AND " + where,
            (application_name,),
        )
        pids = [pid for (pid,) in cur.fetchall()]
        for pid in pids:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pids


def backends(admin: Any, application_name: str, where: str = "TRUE") -> list[int]:
    with admin.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND " + where, (application_name,))
        return [pid for (pid,) in cur.fetchall()]


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


async def stored_events(gw: Gateway, run_id: str) -> list[dict[str, Any]]:
    events: list[Event] = await asyncio.get_running_loop().run_in_executor(
        gw.executor, gw.storage.read_events, run_id, 0, None
    )
    return [e.to_wire() for e in events]


async def metrics(client: TestClient) -> dict[str, Any]:
    response = await client.get("/metrics")
    assert response.status == 200
    return parse_prometheus(await response.text())


async def post_run(client: TestClient, body: dict[str, Any]) -> str:
    response = await client.post("/v1/runs", json=body)
    assert response.status == 201, await response.text()
    return str((await response.json())["hostRunId"])


async def step(plugin: ScriptPlugin, control: str, deltas: int) -> None:
    """Have the stepped script run emit `deltas` deltas, and wait until it has."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await plugin.runtime.control(control).put(Step(deltas, done))
    async with asyncio.timeout(WAIT):
        await done


def check_stored(stored: list[dict[str, Any]], streamed: list[dict[str, Any]]) -> None:
    """Storage holds exactly what the client saw: every event once, seqs 1..n."""
    assert [parse_cursor(e["seq"]) for e in stored] == list(range(1, len(stored) + 1))
    assert stored == [e["data"] for e in streamed]
    assert stored[-1]["kind"] == "run.completed"


@pytest.fixture
def admin() -> Any:
    """An autocommit connection of this test's own (not shared: a helper thread uses it)."""
    conn = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
    conn.autocommit = True
    yield conn
    conn.close()


class TcpProxy:
    """A TCP proxy on 127.0.0.1 to PostgreSQL. `cut()` closes the listener and drops every open
    connection (to the gateway the database is gone: connections break, connects are refused);
    `restore()` listens on the same port again."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.transport.abort()
                return
            self.connections += 1
            pair = {writer.transport, up_writer.transport}
            self._transports |= pair
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
            self._transports -= pair
        finally:
            self._tasks.discard(task)

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.transport.abort()

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        self._server = None
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()

    async def restore(self) -> None:
        await self.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self.cut()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.fixture
async def pg_proxy() -> AsyncIterator[TcpProxy]:
    target = urlsplit(POSTGRES_URL)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


# -- health: readiness and liveness on both backends ------------------------------------------------


async def test_health_has_readiness_and_liveness(make_gateway: MakeGateway, storage_kind: str) -> None:
    client = await make_gateway(storage=storage_kind)
    ready = await client.get("/v1/health")
    assert ready.status == 200
    body = await ready.json()
    assert body["status"] == "ok" and body["storage"] == "up"
    assert (await client.get("/v1/health?probe=ready")).status == 200
    live = await client.get("/v1/health?probe=live")
    assert live.status == 200 and (await live.json())["status"] == "ok"
    bad = await client.get("/v1/health?probe=deep")
    assert bad.status == 400 and (await bad.json())["error"]["code"] == "invalid_request"


# -- (a) connections dropped while idle ---------------------------------------------------------------


async def test_requests_succeed_after_the_server_drops_idle_connections(make_gateway: MakeGateway, admin: Any) -> None:
    name = app_name()
    schema = f"ag_gw_{uuid.uuid4().hex[:12]}"
    client = await make_gateway(
        storage="postgres", schema=schema, overrides={"storage": {"url": storage_url(schema, name)}}
    )
    gw = gateway_of(client)
    assert isinstance(gw.storage, PeeweeStorage)
    receipt, streamed = await run_to_end(client, run_body("before the restart"))
    run_id = receipt["hostRunId"]
    assert (await client.put("/v1/preferences", json={"values": {"ai.common.defaultAgent": "chat-only"}})).status == 200
    # The run's end is stored (its stream ends before that): the journal writer has connected.
    await gw.runs.wait(run_id)

    assert len(terminate(admin, name)) >= 2  # the journal writer's and the request workers'
    # Each worker thread meets its dead connection once; every request still answers.
    for _ in range(3):
        run = await client.get(f"/v1/runs/{run_id}")
        assert run.status == 200, await run.text()
        assert (await run.json())["status"] == "completed"
        assert await events_page(client, run_id) == [e["data"] for e in streamed]
        assert (await client.get(f"/v1/runs/{run_id}/receipts")).status == 200
        prefs = await client.get("/v1/preferences")
        assert prefs.status == 200, await prefs.text()
        assert (await client.get("/v1/health")).status == 200
    assert gw.storage.connections_lost >= 1
    # Writes too: a new run goes through creation, events, status and session on fresh connections.
    terminate(admin, name)
    receipt2, streamed2 = await run_to_end(client, run_body("after the restart"))
    await gw.journal.flush()
    check_stored(await stored_events(gw, receipt2["hostRunId"]), streamed2)
    samples = await metrics(client)
    assert metric(samples, "agent_gateway_journal_commit_errors_total") == gw.journal.commit_errors


# -- (b) connections dropped mid-run, mid-commit --------------------------------------------------------


async def test_a_run_survives_its_connections_dropped_mid_commit(make_gateway: MakeGateway, admin: Any) -> None:
    name = app_name()
    schema = f"ag_gw_{uuid.uuid4().hex[:12]}"
    script = ScriptPlugin()
    client = await make_gateway(
        storage="postgres",
        schema=schema,
        overrides={"storage": {"url": storage_url(schema, name)}},
        extra_plugins=(script,),
    )
    gw = gateway_of(client)
    assert isinstance(gw.storage, PeeweeStorage)
    run_id = await post_run(client, script_body("s-midrun", "req-midrun", control="c"))
    reader = asyncio.create_task(read_stream(client, run_id))
    await step(script, "c", 50)
    await gw.journal.flush()

    # Hold the events table so the next commit waits inside its transaction, then kill the
    # writer's connection there, twice: the storage retries once on a fresh connection, then
    # gives up; the journal counts the failed commit and tries again.
    locker = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
    blocked = "wait_event_type = 'Lock' AND starts_with(query, 'INSERT INTO')"
    try:
        with locker.cursor() as cur:
            cur.execute(f'LOCK TABLE "{schema}"."ag_events" IN EXCLUSIVE MODE')
        await step(script, "c", 200)
        killed: set[int] = set()

        async def writer_blocked() -> bool:  # a connection not killed yet waits on the lock
            return bool(set(await in_thread(backends, admin, name, blocked)) - killed)

        for _ in range(2):
            await poll(writer_blocked, "the journal writer never waited on the lock")
            killed.update(await in_thread(terminate, admin, name, blocked))
        await poll(lambda: _true(gw.journal.commit_errors >= 1), "the failed commit was not counted")
    finally:
        locker.rollback()  # releases the lock
        locker.close()

    # More events while every connection of the gateway is killed between bursts.
    for _ in range(3):
        await in_thread(terminate, admin, name)
        await step(script, "c", 100)
    await script.runtime.control("c").put(None)
    async with asyncio.timeout(WAIT):
        streamed = await reader
        await gw.runs.wait(run_id)
        await gw.journal.flush()
    assert streamed[-1]["event"] == "run.completed"
    check_stored(await stored_events(gw, run_id), streamed)
    assert gw.storage.connections_lost >= 2
    samples = await metrics(client)
    assert metric(samples, "agent_gateway_journal_commit_errors_total") >= 1
    assert metric(samples, "agent_gateway_journal_pending_events") == 0
    run = await client.get(f"/v1/runs/{run_id}")
    assert (await run.json())["status"] == "completed"


async def _true(value: bool) -> bool:
    return value


# -- (c) the database unreachable, then back ---------------------------------------------------------


def spooled_seqs(spool_dir: Path, run_id: str) -> set[int]:
    """The seqs of `run_id` the spool files hold (their `data:` lines are the wire JSON)."""
    seqs = set()
    for path in spool_dir.iterdir():
        for line in path.read_bytes().splitlines():
            if line.startswith(b"data: "):
                wire = json.loads(line[6:])
                if wire.get("hostRunId") == run_id:
                    seqs.add(parse_cursor(wire["seq"]))
    return seqs


async def test_an_unreachable_database_is_reported_and_caught_up(pg_proxy: TcpProxy, make_gateway: MakeGateway) -> None:
    # (The proxy fixture comes first, so it outlives the gateway: a gateway cannot stop while
    # events wait for a database it cannot reach.)
    schema = f"ag_gw_{uuid.uuid4().hex[:12]}"
    script = ScriptPlugin()
    url = storage_url(schema, app_name(), host="127.0.0.1", port=pg_proxy.port)
    client = await make_gateway(
        storage="postgres", schema=schema, overrides={"storage": {"url": url}}, extra_plugins=(script,)
    )
    gw = gateway_of(client)
    assert pg_proxy.connections >= 1  # the gateway really talks through the proxy
    run_id = await post_run(client, script_body("s-outage", "req-outage", control="c"))
    reader = asyncio.create_task(read_stream(client, run_id, timeout=WAIT * 2))
    await step(script, "c", 20)
    await gw.journal.flush()
    committed = len(await stored_events(gw, run_id))

    await pg_proxy.cut()
    try:
        await _while_unreachable(client, gw, script, run_id, committed)
    finally:
        await pg_proxy.restore()

    async def ready_again() -> bool:
        return (await client.get("/v1/health")).status == 200

    await poll(ready_again, "readiness did not recover")
    async with asyncio.timeout(WAIT):
        streamed = await reader
        await gw.runs.wait(run_id)
        await gw.journal.flush()
    assert gw.journal.pending == 0
    check_stored(await stored_events(gw, run_id), streamed)
    run = await client.get(f"/v1/runs/{run_id}")
    assert (await run.json())["status"] == "completed"
    # New runs are accepted again.
    receipt, streamed2 = await run_to_end(client, script_body("s-after", "req-after", deltas=5))
    await gw.journal.flush()
    check_stored(await stored_events(gw, receipt["hostRunId"]), streamed2)


async def _while_unreachable(
    client: TestClient, gw: Gateway, script: ScriptPlugin, run_id: str, committed: int
) -> None:
    # The run goes on: its events reach the client and the spool, not the database.
    await step(script, "c", 30)
    await poll(lambda: _true(gw.journal.commit_errors >= 1), "no commit failed while the database was away")
    assert gw.journal.pending >= 30
    last = await gw.journal.last_event(run_id)
    assert last is not None and last.seq == committed + 30
    uncommitted = set(range(committed + 1, last.seq + 1))
    assert uncommitted <= spooled_seqs(gw.data_dir / "spool", run_id)

    ready = await client.get("/v1/health")
    assert ready.status == 503
    body = await ready.json()
    assert body["status"] == "degraded" and body["storage"] == "down"
    assert body["journalPending"] >= 30
    live = await client.get("/v1/health?probe=live")
    assert live.status == 200

    refused = await client.post("/v1/runs", json=run_body("while the database is away"))
    assert refused.status == 503
    assert refused.content_type == "application/json"
    error = (await refused.json())["error"]
    assert error["code"] == "storage_unavailable" and "database" in error["message"]
    assert refused.headers["Retry-After"].isdigit()
    assert metric(await metrics(client), "agent_gateway_journal_commit_errors_total") >= 1

    # The run ends while the database is still away; its end is stored once it is back.
    await script.runtime.control("c").put(None)
    await poll(lambda: _true(gw.journal.has_terminal(run_id)), "the run did not end")
    assert (await client.get("/v1/health")).status == 503
