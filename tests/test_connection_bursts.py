"""A burst of connections is spread over loop turns: the gateway's accept loop takes a few
connections per turn (`ACCEPT_BATCH`), and event-stream requests start their handling a few per
turn (`StreamOpenings`), in arrival order, while other requests go ahead of the ones waiting.
Turns are counted by a callback that reschedules itself (one call per loop turn): no clock."""

from __future__ import annotations

import asyncio
import collections
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from agent_gateway.server import http_server
from agent_gateway.server.http_server import (
    GatewayRunner,
    GuardedTCPSite,
    JsonErrorRequestHandler,
    JsonErrorServer,
    StreamOpenings,
)

WAIT = 20.0  # a bound on every wait, never a measured duration


class Turns:
    """The number of the current loop turn."""

    def __init__(self) -> None:
        self.number = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.number += 1
        self._handle = self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._handle.cancel()


@pytest.fixture
async def site() -> AsyncIterator[tuple[GatewayRunner, GuardedTCPSite]]:
    async def stream(request: web.Request) -> web.Response:
        return web.Response(text="stream", content_type="text/event-stream")

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/stream", stream)
    app.router.add_get("/ping", ping)
    runner = GatewayRunner(app)
    await runner.setup()
    site = GuardedTCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner, site
    finally:
        await runner.cleanup()


async def test_stream_openings_start_a_few_per_turn_in_arrival_order() -> None:
    openings = StreamOpenings(per_turn=3)
    assert [openings.may_start() for _ in range(4)] == [True, True, True, False]
    turns = Turns()
    started: list[tuple[int, int]] = []  # (turn, arrival index)

    async def stream(index: int) -> None:
        await openings.wait_turn()
        started.append((turns.number, index))

    try:
        await asyncio.wait_for(asyncio.gather(*(stream(i) for i in range(10))), WAIT)
    finally:
        turns.stop()
    assert [index for _, index in started] == list(range(10))  # arrival order
    per_turn = collections.Counter(turn for turn, _ in started)
    assert max(per_turn.values()) <= 3 and len(per_turn) >= 4
    # Nothing waits any more: the next turn starts a stream at once again.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert openings.may_start()


async def test_event_streams_wait_their_turn_and_other_requests_go_ahead(
    site: tuple[GatewayRunner, GuardedTCPSite], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event-stream request beyond this turn's openings waits, its bytes held before they are
    parsed; a plain request (and a stream request that does not ask for text/event-stream) is
    answered meanwhile; the waiting stream is answered once its turn comes, and does not count
    against the openings a second time."""
    runner, tcp_site = site
    server = runner.server
    assert isinstance(server, JsonErrorServer)
    waiting = asyncio.Event()
    held_starts: list[Callable[[], bool]] = []

    def later(start: Callable[[], bool]) -> None:
        held_starts.append(start)
        waiting.set()

    async def no_second_wait() -> None:
        raise AssertionError("a stream whose opening was counted at its parse waited again")

    monkeypatch.setattr(server.stream_openings, "may_start", lambda: False)
    monkeypatch.setattr(server.stream_openings, "later", later)
    monkeypatch.setattr(server.stream_openings, "wait_turn", no_second_wait)
    url = tcp_site.name
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
        held = asyncio.create_task(http.get(url + "/stream", headers={"Accept": "text/event-stream"}))
        await asyncio.wait_for(waiting.wait(), WAIT)
        async with http.get(url + "/ping") as ping:
            assert ping.status == 200 and await ping.json() == {"ok": True}
        async with http.get(url + "/stream") as plain:
            assert await plain.text() == "stream"
        assert not held.done() and len(held_starts) == 1
        assert held_starts[0]()  # its turn: the held bytes are parsed and handled
        async with await asyncio.wait_for(held, WAIT) as response:
            assert response.status == 200 and await response.text() == "stream"


async def test_a_stream_request_whose_head_missed_the_parse_gate_waits_in_its_handler(
    site: tuple[GatewayRunner, GuardedTCPSite], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose Accept header arrived split (no `text/event-stream` in any one read) is
    not held before its parse; its handler waits for its turn instead."""
    runner, tcp_site = site
    server = runner.server
    assert isinstance(server, JsonErrorServer)
    turn_comes = asyncio.Event()
    waiting = asyncio.Event()

    async def wait_turn() -> None:
        waiting.set()
        await turn_comes.wait()

    reads = asyncio.Event()
    data_received = JsonErrorRequestHandler.data_received

    def reading(self: JsonErrorRequestHandler, data: bytes) -> None:
        data_received(self, data)
        reads.set()

    monkeypatch.setattr(JsonErrorRequestHandler, "data_received", reading)
    monkeypatch.setattr(server.stream_openings, "may_start", lambda: False)
    monkeypatch.setattr(server.stream_openings, "wait_turn", wait_turn)
    reader, writer = await asyncio.open_connection(*tcp_site.name.rsplit("/", 1)[-1].rsplit(":", 1))
    try:
        writer.write(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-")
        await writer.drain()
        await asyncio.wait_for(reads.wait(), WAIT)  # the server read the first part on its own
        writer.write(b"stream\r\nConnection: close\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(waiting.wait(), WAIT)
        turn_comes.set()
        answer = await asyncio.wait_for(reader.read(), WAIT)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"stream")
    finally:
        writer.close()


async def test_a_burst_of_connections_is_accepted_a_few_per_turn(
    site: tuple[GatewayRunner, GuardedTCPSite], monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 connections wait in the backlog (the kernel completed their handshakes while the loop
    did not turn): they reach the server at most `ACCEPT_BATCH` per loop turn, and all are served."""
    _runner, tcp_site = site
    turns = Turns()
    made: list[int] = []
    connection_made = JsonErrorRequestHandler.connection_made

    def counting(self: JsonErrorRequestHandler, transport: asyncio.BaseTransport) -> None:
        made.append(turns.number)
        connection_made(self, transport)

    monkeypatch.setattr(JsonErrorRequestHandler, "connection_made", counting)
    port = int(tcp_site.name.rsplit(":", 1)[1])
    clients = [socket.create_connection(("127.0.0.1", port), timeout=WAIT) for _ in range(40)]  # no loop turn
    try:
        for client in clients:
            client.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        for _ in range(10_000):  # bounded: loop turns until every connection reached the server
            if len(made) == len(clients):
                break
            await asyncio.sleep(0)
        assert len(made) == len(clients)
        per_turn = collections.Counter(made)
        assert max(per_turn.values()) <= http_server.ACCEPT_BATCH and len(per_turn) >= 40 // http_server.ACCEPT_BATCH

        def answer(client: socket.socket) -> bytes:
            received = b""
            for _ in range(1000):
                chunk = client.recv(65536)
                if not chunk:
                    break
                received += chunk
            return received

        answers = await asyncio.wait_for(
            asyncio.gather(*(asyncio.to_thread(answer, client) for client in clients)), WAIT
        )
        assert all(a.startswith(b"HTTP/1.1 200") for a in answers)
    finally:
        turns.stop()
        for client in clients:
            client.close()


# A fresh process (its descriptor table at its start size): a site allowing 600 connections, then
# 500 clients of its own (1,000 descriptors, server and client sides) answered one by one. Prints
# the table's size (the kernel's FDSize) before the site, after its start and after the burst, the
# answers, and the soft descriptor limit. A worker thread exists first, as in the gateway (the table is then shared).
BURST_IN_A_FRESH_PROCESS = """
    import asyncio, concurrent.futures, resource
    from pathlib import Path
    from aiohttp import web
    from agent_gateway.server.http_server import ConnectionLimits, GatewayRunner, GuardedTCPSite

    def fd_size():
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("FDSize:"))
        return int(line.split()[1])

    async def main():
        await asyncio.get_running_loop().run_in_executor(concurrent.futures.ThreadPoolExecutor(1), int)
        async def ping(request):
            return web.Response(text="ok")
        app = web.Application()
        app.router.add_get("/ping", ping)
        runner = GatewayRunner(app, limits=ConnectionLimits(max_connections=600))
        await runner.setup()
        before = fd_size()
        site = GuardedTCPSite(runner, "127.0.0.1", 0)
        await site.start()
        started = fd_size()
        port = int(site.name.rsplit(":", 1)[1])
        answered = 0
        clients = []
        for _ in range(500):
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 20)
            writer.write(b"GET /ping HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n")
            answered += (await asyncio.wait_for(reader.readline(), 20)).startswith(b"HTTP/1.1 200")
            clients.append(writer)  # kept open: every connection holds its descriptors
        print(before, started, fd_size(), answered, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        for writer in clients:
            writer.close()
        await runner.cleanup()

    asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the descriptor table's size from /proc")
def test_a_burst_of_connections_never_grows_the_descriptor_table() -> None:
    """Growing the table in a process with threads blocks the thread that makes the descriptor
    (the loop, accepting) for an RCU grace period: the site grows it once, at its start."""
    before, started, after, answered, limit = map(int, _in_a_fresh_process(BURST_IN_A_FRESH_PROCESS))
    assert answered == 500
    assert before < 1000  # a fresh process's table, grown below by the site
    wanted = 600 * http_server.DESCRIPTORS_PER_CONNECTION + http_server.DESCRIPTORS_MARGIN
    assert started >= min(wanted, limit)  # (within the soft RLIMIT_NOFILE)
    assert after == started


RESERVE_UNDER_A_LIMIT = """
    import os, resource, socket
    from agent_gateway.server.http_server import reserve_descriptors

    resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    source = socket.socket()
    in_use = os.dup2(source.fileno(), 300)
    print(reserve_descriptors(301, source.fileno()))  # 300 is taken: the next free one
    os.fstat(in_use)  # still open
    print(reserve_descriptors(100_000, source.fileno()))  # capped by the soft limit
    os.dup2(source.fileno(), 511)  # the last descriptor the limit allows, taken
    print(reserve_descriptors(100_000, source.fileno()))
    print(reserve_descriptors(2, source.fileno()))  # below the descriptors already open
"""


def test_reserving_descriptors_closes_none_in_use_and_stays_within_the_limit() -> None:
    assert _in_a_fresh_process(RESERVE_UNDER_A_LIMIT) == ["301", "511", "0", "0"]


def _in_a_fresh_process(script: str) -> list[str]:
    """What `script` prints, run by a new interpreter (its descriptor table at its start size)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=WAIT * 6
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()
