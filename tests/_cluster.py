"""Helpers for the cluster tests: a fresh PostgreSQL database per test, a Redis key prefix per
test, and several real `agent-gateway serve` processes sharing them."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from agent_gateway.testing.sse import sse_events
from tests._cli import Served, clean_env, serve
from tests._harness import POSTGRES_URL

REDIS_URL = "redis://127.0.0.1:6379/0"
# The [cluster] secret the test instances sign their Redis messages with.
SECRET = "test-cluster-secret-" + "0123456789abcdef" * 2
JSON = {"Content-Type": "application/json"}


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty PostgreSQL database (dropped afterwards); yields its URL."""
    import psycopg2

    name = "ag_cluster_" + secrets.token_hex(6)
    admin = psycopg2.connect(POSTGRES_URL, connect_timeout=5)
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        base = POSTGRES_URL.rsplit("/", 1)[0]
        yield f"{base}/{name}"
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def instance_env(
    tmp_path: Path,
    name: str,
    database_url: str,
    *,
    redis_url: str | None,
    key_prefix: str,
    extra: dict[str, str],
    secret: str = SECRET,
) -> dict[str, str]:
    env = clean_env(
        tmp_path,
        AGENT_GATEWAY__STORAGE__URL=database_url,
        AGENT_GATEWAY__GATEWAY__DATA_DIR=str(tmp_path / name),
        **extra,
    )
    if redis_url is not None:
        env["AGENT_GATEWAY__CLUSTER__REDIS_URL"] = redis_url
        env["AGENT_GATEWAY__CLUSTER__INSTANCE_ID"] = name
        env["AGENT_GATEWAY__CLUSTER__KEY_PREFIX"] = key_prefix
        env.setdefault("AGENT_GATEWAY__CLUSTER__SECRET", secret)
    return env


@contextlib.asynccontextmanager
async def instances(
    tmp_path: Path,
    database_url: str,
    count: int = 3,
    *,
    redis_url: str | None = REDIS_URL,
    extra: dict[str, str] | None = None,
    key_prefix: str | None = None,
    each: list[dict[str, str]] | None = None,
) -> AsyncIterator[list[Served]]:
    """`count` gateways on one database (and, with `redis_url`, one cluster), started at once.
    `each[i]`: environment of instance i only (on top of `extra`)."""
    prefix = key_prefix or "agtest:" + secrets.token_hex(4) + ":"
    tmp_path.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240  (a local mkdir, once)
    async with contextlib.AsyncExitStack() as stack:
        starts = [
            stack.enter_async_context(
                serve(
                    "--port",
                    "0",
                    env=instance_env(
                        tmp_path,
                        f"gw{i}",
                        database_url,
                        redis_url=redis_url,
                        key_prefix=prefix,
                        extra={**(extra or {}), **(each[i] if each else {})},
                    ),
                    cwd=tmp_path,
                )
            )
            for i in range(count)
        ]
        yield list(await asyncio.gather(*starts))


async def post_json(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body, headers=JSON) as response:
        return response.status, await response.json()


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as response:
        return response.status, await response.json()


async def sse(http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None, timeout: float = 60):
    """Every event of an SSE stream until it ends: [(seq, kind, data)]."""
    events = []
    async with asyncio.timeout(timeout), http.get(url, headers=headers or {}) as response:
        assert response.status == 200, await response.text()
        async for event in sse_events(response):
            events.append((event.seq, event.event, event.data))
    return events


async def follow(
    http: aiohttp.ClientSession, urls: list[str], host_run_id: str, *, timeout: float = 90
) -> tuple[list[dict[str, Any]], int]:
    """A client that streams a run to its terminal event, resuming with Last-Event-ID on the next
    instance whenever a connection breaks. Returns every event it was sent and how many times it
    resumed (bounded: at most 20 resumes, `timeout` seconds in all)."""
    seen: list[dict[str, Any]] = []
    resumes = 0
    async with asyncio.timeout(timeout):
        for attempt in range(21):
            url = urls[attempt % len(urls)]
            headers = {"Last-Event-ID": seen[-1]["seq"]} if seen else {}
            try:
                async with http.get(f"{url}/v1/runs/{host_run_id}/stream", headers=headers) as response:
                    if response.status != 200:
                        raise aiohttp.ClientError(f"{response.status}")
                    async for event in sse_events(response):
                        seen.append(event.data)
            except (aiohttp.ClientError, ConnectionError):
                pass
            if seen and seen[-1]["kind"] in TERMINAL_KINDS:
                return seen, resumes
            resumes += 1
    raise AssertionError(f"{host_run_id}: no terminal event after 20 resumes; got {len(seen)} events")


TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})


async def wait_for_health(
    http: aiohttp.ClientSession, url: str, check: Any, *, timeout: float = 30, every: float = 0.1
) -> dict[str, Any]:
    """Poll `url`/v1/health until `check(body)` holds (bounded in time)."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/v1/health") as response:
                    body = await response.json()
                    if check(body):
                        return dict(body)
            await asyncio.sleep(every)  # poll pacing: the condition itself is what the caller waits for


def assert_run_invariants(journal: list[dict[str, Any]], seen: list[dict[str, Any]]) -> None:
    """Exactly one terminal, last; seqs strictly increasing; the client saw the journal exactly."""
    seqs = [int(e["seq"]) for e in journal]
    assert seqs == sorted(set(seqs)), "seqs must strictly increase"
    assert [e["kind"] in TERMINAL_KINDS for e in journal].count(True) == 1, [e["kind"] for e in journal[-3:]]
    assert journal[-1]["kind"] in TERMINAL_KINDS
    assert seen == journal, (len(seen), len(journal))


class Partition:
    """A TCP proxy in front of a server that can cut the network like a partition does: while cut,
    connections stay open (and new ones are accepted) but no byte gets through in either
    direction; healing drops every connection made before (their TCP state would have timed out)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if not self.cut:
                writer.write(data)
                await writer.drain()
        writer.close()

    def heal(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        self.cut = False

    async def stop(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start_redis(port: int, cwd: Path, *args: str) -> asyncio.subprocess.Process:
    """A private redis-server (never the machine's) listening on `port` (plain, or TLS when
    `args` say `--port 0 --tls-port <port> ...`), accepting connections before this returns."""
    proc = await asyncio.create_subprocess_exec(
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *args,
        cwd=cwd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with asyncio.timeout(20):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if proc.returncode is not None:
                    raise AssertionError(f"redis-server exited with {proc.returncode}") from None
                await asyncio.sleep(0.05)  # start-up pacing: the connect is what is waited for
                continue
            writer.close()
            return proc
