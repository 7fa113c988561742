"""Connection hygiene of `agent-gateway serve`, driven over raw sockets on 127.0.0.1.

A client trickling its headers is dropped after ``header_timeout_seconds``; an idle keep-alive
connection after ``idle_timeout_seconds``; beyond ``max_connections`` a connection gets a 503 JSON
answer and is closed; SSE streams send their headers and a comment as they open; a stream client
that stops reading is cut off after ``stream_send_timeout_seconds`` while another keeps streaming;
at the file-descriptor limit the gateway logs a bounded number of accept errors and serves again
once connections close. Every wait is bounded; the only sleeps are the trickling client's own
pace and one observation window at the fd limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._cli import LISTENING, Served, agent_gateway, clean_env, serve, write_config

WAIT = 20.0


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, gateway: dict[str, Any], extra: str = "") -> AsyncIterator[Served]:
    config = write_config(tmp_path, gateway, extra)
    args = ("--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "data"), "--log-format", "text")
    async with serve(*args, env=clean_env(tmp_path), cwd=tmp_path) as gw:
        yield gw


def connect(port: int, timeout: float = WAIT) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def read_until_closed(sock: socket.socket, limit: float = WAIT) -> bytes:
    """Everything the server sends until it closes the connection (EOF or reset), within `limit`."""
    received = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the server kept the connection open for {limit} s; got {received[:300]!r}")


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The response head and whatever body bytes came with it."""
    received = b""
    for _ in range(1000):
        if b"\r\n\r\n" in received:
            break
        chunk = sock.recv(65536)
        assert chunk, f"closed before the response head: {received!r}"
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    return head, rest


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def json_body(response: bytes) -> Any:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return json.loads(body)


async def test_a_client_trickling_its_headers_is_dropped_after_the_header_timeout(tmp_path: Path) -> None:
    async with serving(tmp_path, {"header_timeout_seconds": 0.5, "idle_timeout_seconds": 60.0}) as gw:
        sock = connect(gw.port)
        started = time.monotonic()
        sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
        lines = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            # a header line every 0.1 s (the trickle itself), never the blank line; bounded at 100
            for lines in range(1, 101):
                await asyncio.sleep(0.1)
                sock.sendall(b"X-Trickle: %d\r\n" % lines)
        dropped_after = time.monotonic() - started
        assert lines < 60, "the trickling client was never disconnected"
        assert read_until_closed(sock, 5.0) == b""
        assert 0.4 <= dropped_after <= 5.0, dropped_after
        sock.close()

        # A client that connects and sends nothing is dropped too.
        silent = connect(gw.port)
        assert read_until_closed(silent, 5.0) == b""
        silent.close()

        # A complete request is served, and the kept-alive connection is not cut by the header timer.
        sock = connect(gw.port)
        sock.sendall(get("/v1/health"))
        head, _ = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200"), head
        sock.close()


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    async with serving(tmp_path, {"header_timeout_seconds": 30.0, "idle_timeout_seconds": 0.5}) as gw:
        sock = connect(gw.port)
        sock.sendall(get("/v1/health"))
        head, _ = read_head(sock)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head, head
        started = time.monotonic()
        read_until_closed(sock, 5.0)
        assert time.monotonic() - started >= 0.4
        sock.close()


async def test_beyond_the_connection_cap_a_connection_gets_a_503_json_answer(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    settings = {"max_connections": 3, "header_timeout_seconds": 30.0, "heartbeat_seconds": 60.0}
    extra = f'[workspaces]\nroots = {{ "w1" = "{tmp_path / "ws"}" }}\n'
    async with serving(tmp_path, settings, extra) as gw:
        held = []
        for _ in range(2):  # two kept-alive connections, each served once
            sock = connect(gw.port)
            sock.sendall(get("/v1/health"))
            head, _ = read_head(sock)
            assert head.startswith(b"HTTP/1.1 200"), head
            held.append(sock)
        stream = connect(gw.port)  # and a stream
        stream.sendall(get("/v1/workspaces/w1/events"))
        head, _ = read_head(stream)
        assert head.startswith(b"HTTP/1.1 200"), head
        held.append(stream)
        extra = connect(gw.port)
        extra.sendall(get("/v1/health"))
        answer = read_until_closed(extra, 5.0)  # answered, then closed
        assert answer.startswith(b"HTTP/1.1 503"), answer
        assert b"Retry-After: 1" in answer
        assert json_body(answer)["error"]["code"] == "too_many_connections"
        extra.close()

        # The stream's client leaves: its slot frees up at once (not at the stream's next heartbeat,
        # a minute away), so a new connection is served again after a few tries at most.
        held.pop().close()
        for _ in range(200):
            sock = connect(gw.port)
            sock.sendall(get("/v1/health"))
            head, _ = read_head(sock)
            sock.close()
            if head.startswith(b"HTTP/1.1 200"):
                break
        assert head.startswith(b"HTTP/1.1 200"), head
        for sock in held:
            sock.close()


async def test_workspace_and_run_streams_send_headers_and_a_comment_at_once(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    fake = FakeOpenAI(default=Reply("hello", hang=True), hang_timeout=WAIT)
    base_url = await fake.start()
    extra = f'[workspaces]\nroots = {{ "w1" = "{workspace}" }}\n[chat_only]\nbase_url = "{base_url}"\nmodel = "m"\n'
    try:
        # Heartbeats far apart: whatever arrives promptly is the opening, not a heartbeat.
        async with serving(tmp_path, {"heartbeat_seconds": 60.0, "shutdown_grace_seconds": 0.0}, extra) as gw:
            sock = connect(gw.port, timeout=5.0)
            sock.sendall(get("/v1/workspaces/w1/events"))
            head, body = read_head(sock)
            assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
            for _ in range(10):
                if b"\n\n" in body:
                    break
                body += sock.recv(65536)
            assert body.split(b"\r\n", 1)[1].startswith(b": "), body  # a comment, first thing
            sock.close()

            async with aiohttp.ClientSession() as http:
                run = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
                async with http.post(f"{gw.url}/v1/runs", json=run) as response:
                    assert response.status == 201, await response.text()
                    run_id = (await response.json())["hostRunId"]
            sock = connect(gw.port, timeout=5.0)
            sock.sendall(get(f"/v1/runs/{run_id}/stream"))
            head, body = read_head(sock)
            assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
            for _ in range(10):
                if b"\n\n" in body:
                    break
                body += sock.recv(65536)
            assert body.split(b"\r\n", 1)[1].startswith(b": "), body
            sock.close()
    finally:
        await fake.stop()


async def test_a_stream_client_that_stops_reading_is_cut_off_while_another_keeps_streaming(
    tmp_path: Path,
) -> None:
    # ~8 MB of deltas over a few seconds: more than the socket buffers between the gateway and a
    # client that never reads hold, so its writes stall.
    fake = FakeOpenAI(default=Reply("x" * 8_000_000, chunk_size=32_000, delay=0.01))
    base_url = await fake.start()
    extra = f'[chat_only]\nbase_url = "{base_url}"\nmodel = "m"\n'
    try:
        async with serving(tmp_path, {"stream_send_timeout_seconds": 0.5}, extra) as gw:
            timeout = aiohttp.ClientTimeout(total=60.0)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                run = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
                async with http.post(f"{gw.url}/v1/runs", json=run) as response:
                    assert response.status == 201, await response.text()
                    run_id = (await response.json())["hostRunId"]
                stalled = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
                stalled.settimeout(WAIT)
                stalled.connect(("127.0.0.1", gw.port))
                stalled.sendall(get(f"/v1/runs/{run_id}/stream"))  # ... and never reads
                async with http.get(f"{gw.url}/v1/runs/{run_id}/stream") as response:
                    events = await large_frames(response)
            assert events[-1][1] == "run.completed", events[-1]
            seqs = [seq for seq, _ in events]
            assert seqs == list(range(1, len(seqs) + 1))  # the reader got every event, in order
            # The stalled client was dropped mid-run: its connection ends without the terminal event.
            got = read_until_closed(stalled, 5.0)
            assert b"run.completed" not in got
            stalled.close()
    finally:
        await fake.stop()


async def large_frames(response: aiohttp.ClientResponse) -> list[tuple[int, str]]:
    """(seq, event name) of every SSE frame, however long its data line (merged deltas of a client
    that fell behind can exceed the client's line limit)."""
    frames: list[tuple[int, str]] = []
    buffer = b""
    async for chunk in response.content.iter_any():
        buffer += chunk
        *complete, buffer = buffer.split(b"\n\n")
        for frame in complete:
            fields = dict(line.split(b": ", 1) for line in frame.split(b"\n") if line and not line.startswith(b":"))
            if b"id" in fields:
                frames.append((int(fields[b"id"]), fields[b"event"].decode()))
    return frames


@contextlib.contextmanager
def client_sockets(port: int, count: int) -> Iterator[list[socket.socket]]:
    """`count` non-blocking connections started to `port` (the kernel completes what it can)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


ACCEPT_ERROR = "cannot accept connections"


async def test_at_the_fd_limit_accept_errors_are_logged_a_bounded_number_of_times(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"max_connections": 100_000, "header_timeout_seconds": 60.0})
    stderr_path = tmp_path / "serve.err"
    fd_limit = 160

    def lower_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    args = ("serve", "--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "data"))
    with stderr_path.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            agent_gateway(),
            *args,
            "--log-format",
            "text",
            env=clean_env(tmp_path),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            preexec_fn=lower_fd_limit,
        )
    gw = Served(proc, stderr_path)
    try:
        for line in await gw.read_until("agent-gateway listening on"):
            match = LISTENING.match(line)
            if match:
                gw.url, gw.port = match[1], int(match[3])
        with client_sockets(gw.port, fd_limit + 60):
            for _ in range(400):  # until the gateway reports it (bounded: 400 x 25 ms)
                if ACCEPT_ERROR in gw.stderr():
                    break
                await asyncio.sleep(0.025)
            assert ACCEPT_ERROR in gw.stderr(), gw.stderr()[-2000:]
            # The observation window: asyncio's own accept loop logged hundreds of thousands of
            # lines in this time; the gateway logs one per 10 s.
            await asyncio.sleep(1.5)
            log = gw.stderr()
        assert log.count(ACCEPT_ERROR) <= 2, log.count(ACCEPT_ERROR)
        assert "out of system resource" not in log
        assert len(log) < 50_000, len(log)
        # The clients are gone: the gateway serves again (bounded retries while it frees them).
        status = 0
        timeout = aiohttp.ClientTimeout(total=5.0)
        for _ in range(100):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with aiohttp.ClientSession(timeout=timeout) as http:
                    async with http.get(f"{gw.url}/v1/health") as response:
                        status = response.status
                        break
        assert status == 200
        assert await gw.terminate() == 0, gw.stderr()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
