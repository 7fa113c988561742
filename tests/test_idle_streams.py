"""Idle SSE streams stay cheap without losing what the SSE library used to give them.

- The response headers (event-stream content type, no-cache, Connection: close, X-Accel-Buffering:
  no), chunked HTTP/1.1 bodies, and ping comments while nothing happens.
- Once its headers are out, a stream's connection leaves aiohttp: no request task of aiohttp's
  stays behind an idle stream, only the stream's own; the stream still ends with the last chunk,
  then the connection closes; a client that leaves ends its stream at once.
- One heartbeat timer per period wakes every open stream (not a timer, or a ping task, per
  stream); it is gone once the last stream closed.
- The subscriber's `Wakeup`: a one-waiter flag whose future exists only while it is waited on.
- A stream runs after its handler returned (from the response's `write_eof`): a storage failure
  while it replays is still one log line, not a traceback, and drops the connection.
Every wait is bounded by WAIT seconds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import aiohttp
import pytest

from agent_gateway.bus import Wakeup
from agent_gateway.models import Event
from agent_gateway.storage import StorageUnavailable
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import MakeGateway, gateway_of

WAIT = 20.0
HEARTBEAT = 0.2
CLIENT = {"X-Agent-Gateway-Client": "test"}


async def test_idle_streams_get_headers_and_pings_from_one_shared_timer(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.add(Reply(text="never finished", hang=True))
    client = await make_gateway(overrides={"gateway": {"heartbeat_seconds": HEARTBEAT}})
    stats = gateway_of(client).stream_stats
    body = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
    created = await client.post("/v1/runs", json=body, headers=CLIENT)
    assert created.status == 201, await created.text()
    run_id = (await created.json())["hostRunId"]

    streams = [await client.get(f"/v1/runs/{run_id}/stream") for _ in range(2)]
    try:
        for response in streams:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert response.headers["Cache-Control"] == "no-cache"
            assert response.headers["Connection"] == "close"  # the connection ends with the stream
            assert response.headers["X-Accel-Buffering"] == "no"
            assert response.headers["Transfer-Encoding"] == "chunked"
        # Both streams hear the heartbeat as a ping comment (after whatever the run sent so far).
        async with asyncio.timeout(WAIT):
            for response in streams:
                received = b""
                for _ in range(1000):
                    if b": ping\r\n\r\n" in received:
                        break
                    received += await response.content.readany()
                assert b": ping\r\n\r\n" in received, received
        assert list(stats._beat_timers) == [HEARTBEAT]  # one timer for both streams
        assert len(stats._beating[HEARTBEAT]) == 2
    finally:
        for response in streams:
            response.close()
    assert await stats.wait_closed(WAIT)
    assert stats._beat_timers == {} and stats._beating == {}  # no timer left behind
    cancelled = await client.post(f"/v1/runs/{run_id}/cancel", headers=CLIENT)
    assert cancelled.status == 202, await cancelled.text()


def _tasks_running(qualname: str) -> int:
    return sum(1 for task in asyncio.all_tasks() if getattr(task.get_coro(), "__qualname__", "") == qualname)


def _stream_requests_in_aiohttp() -> int:
    """aiohttp's request tasks serving a stream (the fake upstream's hanging request has one too)."""
    count = 0
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        if getattr(coro, "__qualname__", "") == "RequestHandler._handle_request":
            request = coro.cr_frame.f_locals.get("request") if coro.cr_frame else None  # type: ignore[union-attr]
            count += request is not None and request.path.endswith("/stream")
    return count


async def _eventually(holds: Any, turns: int = 200) -> bool:
    """Whether `holds()` becomes true within `turns` 10 ms turns of the loop (what is awaited
    here happens in the gateway's own tasks, a few loop turns after the client's last read)."""
    for _ in range(turns):
        if holds():
            return True
        await asyncio.sleep(0.01)
    return bool(holds())


async def test_an_open_stream_leaves_aiohttp_and_still_ends_with_the_last_chunk(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    fake_llm.add(Reply(text="never finished", hang=True))
    client = await make_gateway(overrides={"gateway": {"heartbeat_seconds": 60.0}})
    stats = gateway_of(client).stream_stats
    body = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
    created = await client.post("/v1/runs", json=body, headers=CLIENT)
    assert created.status == 201, await created.text()
    run_id = (await created.json())["hostRunId"]

    # Raw clients, so the bytes after the terminal event and the close are visible.
    path = f"/v1/runs/{run_id}/stream"
    head_request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".encode()
    streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    async with asyncio.timeout(WAIT):
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
            writer.write(head_request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, head
            streams.append((reader, writer))
        leaving_reader, leaving = streams.pop()
        for reader, _ in streams:
            assert b": stream open" in await reader.readuntil(b"\n\n")
        await leaving_reader.readuntil(b"\n\n")
    # Every stream is open, each in a task of its own; none holds a request task of aiohttp's.
    assert stats.open_streams == 5
    assert await _eventually(lambda: _stream_requests_in_aiohttp() == 0)
    assert _tasks_running("RunStream._serve") == 5

    # A client that leaves ends its stream at once (the heartbeat is a minute away).
    leaving.close()
    assert await _eventually(lambda: stats.open_streams == 4)

    # Bytes a client sends on its stream's connection (a pipelined request, junk) are ignored.
    junk = b"\x00\xff\xfe junk " + "\ud800".encode("utf-8", "surrogatepass")  # NUL, bad UTF-8, a lone surrogate
    streams[0][1].write(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + junk)
    cancelled = await client.post(f"/v1/runs/{run_id}/cancel", headers=CLIENT)
    assert cancelled.status == 202, await cancelled.text()
    async with asyncio.timeout(WAIT):
        for reader, writer in streams:
            rest = await reader.read()  # to the end: the server closes the connection
            assert b"event: run.cancelled" in rest, rest[-300:]
            assert rest.endswith(b"\r\n0\r\n\r\n"), rest[-100:]  # the last chunk, then the close
            assert b"HTTP/1.1" not in rest  # the pipelined request got no answer
            writer.close()
    assert await stats.wait_closed(WAIT)
    assert _tasks_running("RunStream._serve") == 0


async def test_at_shutdown_a_stream_whose_client_stopped_reading_is_dropped(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    # ~8 MB of deltas: more than the socket buffers to a client that never reads hold.
    fake_llm.add(Reply("x" * 8_000_000, chunk_size=32_000))
    client = await make_gateway(
        overrides={"gateway": {"stream_send_timeout_seconds": 60.0, "shutdown_grace_seconds": 0.0}}
    )
    gateway = gateway_of(client)
    body = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
    created = await client.post("/v1/runs", json=body, headers=CLIENT)
    assert created.status == 201, await created.text()
    run_id = (await created.json())["hostRunId"]

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", client.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    writer.write(f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")  # the headers; from here on it never reads
    # The run ends upstream while its stream is stuck writing to the client.
    assert await _eventually(lambda: run_id not in {r.host_run_id for r in gateway.runs.active_runs()}, turns=2000)
    assert gateway.stream_stats.open_streams == 1

    caplog.set_level(logging.WARNING)
    async with asyncio.timeout(WAIT):
        await gateway.drain()
    assert gateway.stream_stats.open_streams == 0  # dropped, not left to the process's exit
    assert any("did not end in time" in r.getMessage() for r in caplog.records)
    writer.close()


async def test_a_storage_failure_while_a_stream_replays_is_one_line_and_drops_it(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_llm.add(Reply(text="never finished", hang=True))
    client = await make_gateway()
    gateway = gateway_of(client)
    gateway.journal.tail_bytes = 0  # the replay must go to storage, not to the run's frames in memory
    body = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
    created = await client.post("/v1/runs", json=body, headers=CLIENT)
    assert created.status == 201, await created.text()
    run_id = (await created.json())["hostRunId"]

    async def unreachable(*args: Any, **kwargs: Any) -> list[Event]:
        raise StorageUnavailable("connection refused")

    gateway.journal.read = unreachable  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING)
    response = await client.get(f"/v1/runs/{run_id}/stream")
    assert response.status == 200  # the headers went out before the first journal read
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):  # dropped, not ended: the client resumes
        async with asyncio.timeout(WAIT):
            for _ in range(1000):
                chunk = await response.content.readany()
                if not chunk:
                    break
                received += chunk
    assert b"event:" not in received
    assert await gateway.stream_stats.wait_closed(WAIT)
    warnings = [r for r in caplog.records if "storage unavailable on the stream of" in r.getMessage()]
    assert len(warnings) == 1 and run_id in warnings[0].getMessage() and warnings[0].exc_info is None
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback logged
    response.close()
    del gateway.journal.read  # the journal's own method again, so the run can be cancelled
    cancelled = await client.post(f"/v1/runs/{run_id}/cancel", headers=CLIENT)
    assert cancelled.status == 202, await cancelled.text()


async def test_wakeup_is_a_flag_with_a_future_only_while_waited_on() -> None:
    wakeup = Wakeup()
    assert not wakeup.is_set()
    waiting = wakeup.wait()
    assert not waiting.done()
    wakeup.set()
    assert waiting.done() and wakeup.is_set()
    assert wakeup._waiter is None  # nothing held once it fired
    assert wakeup.wait().done()  # set already: done at once
    wakeup.clear()
    assert not wakeup.is_set()

    # A waiter cancelled (a timeout) leaves the flag usable: set() neither raises nor is lost.
    cancelled = wakeup.wait()
    cancelled.cancel()
    wakeup.set()
    assert wakeup.is_set() and wakeup._waiter is None
    wakeup.clear()
    async with asyncio.timeout(WAIT):
        later = wakeup.wait()
        asyncio.get_running_loop().call_soon(wakeup.set)
        await later
    assert wakeup.is_set()
