"""Idle SSE streams stay cheap without losing what the SSE library used to give them.

- The response headers (event-stream content type, no-cache, keep-alive, X-Accel-Buffering: no),
  chunked HTTP/1.1 bodies, and ping comments while nothing happens.
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
from typing import Any

import aiohttp
import pytest

from agent_gateway.bus import Wakeup
from agent_gateway.models import Event
from agent_gateway.storage import StorageUnavailable
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests.conftest import MakeGateway, gateway_of

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
            assert response.headers["Connection"] == "keep-alive"
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


async def test_a_storage_failure_while_a_stream_replays_is_one_line_and_drops_it(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_llm.add(Reply(text="never finished", hang=True))
    client = await make_gateway()
    gateway = gateway_of(client)
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
