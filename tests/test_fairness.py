"""No run holds the event loop; the loop-lag monitor reports when something does.

- The chat-only runtime, reading an upstream response that is already buffered in full (the
  upstream wrote it in one go), yields to the loop between bounded slices: a task that counts
  loop iterations sees at most one slice of deltas appended between two of its turns.
- The loop-lag monitor puts a held loop in the `/metrics` histogram and logs one line above
  `[gateway] loop_lag_warn_ms` (0: no line); `config check` refuses a negative threshold.
- Readiness during a busy run asks storage nothing while the journal commits (its commits vouch
  for it), and pings again once a commit failed.
- A reader of a run whose events all wait for storage gets them without a storage read.
- A runtime's slice (`WorkSlices`) ends within a few steps of a request reaching the gateway's
  sockets (a new connection, a kept-alive connection's next request), not when its time is up.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import select
import socket
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agent_gateway.config import Config
from agent_gateway.models import TERMINAL_KINDS, Run
from agent_gateway.plugins.chat_only import runtime as chat_only_runtime
from agent_gateway.routes import system as system_routes
from agent_gateway.runtime import Turn
from agent_gateway.server import fairness
from agent_gateway.server.http_server import GatewayRunner, GuardedTCPSite
from agent_gateway.server.loop_monitor import BUCKETS, LoopLagMonitor
from tests._harness import WAIT, MakeGateway, gateway_of, metric, parse_prometheus, run_body, run_to_end
from tests._sessions import indexer_of

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"xxxxxxxxxxxxxxxx"}}]}\n\n'
TAIL = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


@pytest.fixture
async def burst_upstream() -> AsyncIterator[tuple[str, dict[str, int]]]:
    """An OpenAI-compatible upstream that writes every delta of its answer in one write (so the
    gateway finds the whole response buffered); `settings["deltas"]` says how many."""
    settings = {"deltas": 4000}

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(CHUNK * settings["deltas"] + TAIL)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", settings
    finally:
        await runner.cleanup()


async def test_a_buffered_upstream_is_consumed_in_slices_that_let_the_loop_turn(
    make_gateway: MakeGateway, burst_upstream: tuple[str, dict[str, int]]
) -> None:
    base_url, settings = burst_upstream
    client = await make_gateway({"chat_only": {"base_url": base_url}})
    journal = gateway_of(client).journal
    gaps: list[int] = []
    finished = asyncio.Event()

    async def count_turns() -> None:
        """Between two of this task's turns, how many events were appended."""
        last = journal.appended + journal._unpublished_count
        for _ in range(10_000_000):  # bounded; ends with the run
            if finished.is_set():
                return
            await asyncio.sleep(0)
            now = journal.appended + journal._unpublished_count
            gaps.append(now - last)
            last = now

    counter = asyncio.create_task(count_turns())
    try:
        _receipt, events = await run_to_end(client, run_body("go"))
    finally:
        finished.set()
        await counter
    deltas = [e for e in events if e["event"] == "message.delta"]
    assert sum(len(e["data"]["payload"]["text"]) for e in deltas) == 16 * settings["deltas"]
    assert events[-1]["event"] == "run.completed"
    # One slice is at most SLICE_LINES upstream lines (two per delta: `data:` and the blank line).
    # (Without slices, a buffered response of this size went by in over 2,000 deltas at a time.)
    assert chat_only_runtime.SLICE_LINES <= 256
    assert max(gaps) <= chat_only_runtime.SLICE_LINES // 2 + 8, max(gaps)
    assert sum(gaps) >= settings["deltas"]  # the counter saw the whole run


def test_the_monitor_counts_lags_into_buckets_and_logs_above_the_threshold(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor(warn_after_ms=50)
    with caplog.at_level(logging.WARNING, logger="agent_gateway.loop"):
        monitor.record(0.0004)
        monitor.record(0.03)
        monitor.record(0.2)  # logged
        monitor.record(0.3)  # within the second after a line: counted in the next one, not logged
    assert monitor.count == 4 and monitor.max == 0.3
    cumulative = dict(monitor.cumulative())
    assert cumulative["0.001"] == 1 and cumulative["0.05"] == 2 and cumulative["0.25"] == 3
    assert cumulative["+Inf"] == 4 and cumulative[repr(BUCKETS[-1])] == 4
    lines = [r.getMessage() for r in caplog.records if r.name == "agent_gateway.loop"]
    assert len(lines) == 1 and "blocked for 200 ms" in lines[0]
    quiet = LoopLagMonitor(warn_after_ms=0)
    with caplog.at_level(logging.WARNING, logger="agent_gateway.loop"):
        quiet.record(5.0)
    assert len([r for r in caplog.records if r.name == "agent_gateway.loop"]) == 1


async def test_a_held_loop_shows_in_the_metrics_histogram_and_the_log(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    client = await make_gateway({"gateway": {"loop_lag_warn_ms": 30.0}})
    monitor = gateway_of(client).loop_monitor
    before = parse_prometheus(await (await client.get("/metrics")).text())
    over = metric(before, "agent_gateway_loop_lag_seconds_count") - metric(
        before, "agent_gateway_loop_lag_seconds_bucket", le="0.025"
    )
    with caplog.at_level(logging.WARNING, logger="agent_gateway.loop"):
        counted = monitor.count
        time.sleep(0.08)  # noqa: ASYNC251 (the thing under test: a callback holding the loop for 80 ms)
        async with asyncio.timeout(WAIT):
            while monitor.count == counted:  # noqa: ASYNC110 (the monitor's next sample, due during the hold)
                await asyncio.sleep(0.005)
    after = parse_prometheus(await (await client.get("/metrics")).text())
    over_after = metric(after, "agent_gateway_loop_lag_seconds_count") - metric(
        after, "agent_gateway_loop_lag_seconds_bucket", le="0.025"
    )
    assert over_after >= over + 1
    assert metric(after, "agent_gateway_loop_lag_seconds_sum") >= 0.05
    assert any("event loop blocked" in r.getMessage() for r in caplog.records if r.name == "agent_gateway.loop")


def test_config_check_refuses_a_negative_lag_threshold() -> None:
    problems = Config.load(None, env={}, overrides={"gateway": {"loop_lag_warn_ms": -1.0}}).problems()
    assert any("loop_lag_warn_ms" in problem for problem in problems), problems


async def test_readiness_skips_the_ping_while_the_journal_commits_and_pings_after_a_failed_commit(
    make_gateway: MakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window no stall of a busy machine outlasts: what is checked is which event vouches, not
    # how long (an event loop held 2.8 s by a loaded CI machine outlasted the 1 s default).
    window = 3600.0
    monkeypatch.setattr(system_routes, "COMMIT_VOUCHES_S", window)
    client = await make_gateway()
    gw = gateway_of(client)
    pings: list[float] = []
    real_ping = gw.storage.ping

    def counting_ping() -> None:
        pings.append(time.monotonic())
        real_ping()

    gw.storage.ping = counting_ping  # type: ignore[method-assign]
    await run_to_end(client, run_body("hello"))
    # The run's session index entry, which goes with a later commit: made now, not while the
    # health checks below set what vouches for storage.
    await indexer_of(client).settle()
    await gw.journal.flush()
    assert (await client.get("/v1/health")).status == 200
    assert pings == []  # a commit just now vouched for storage
    gw.journal.last_commit_at = time.monotonic() - 2 * window  # as after a failed commit, long ago
    assert (await client.get("/v1/health")).status == 200
    assert len(pings) == 1
    assert (await client.get("/v1/health")).status == 200
    assert len(pings) == 1  # the ping just now vouches for storage as a commit does
    gw.journal.commit_errors += 1  # a commit failed after that ping: it no longer vouches
    assert (await client.get("/v1/health")).status == 200
    assert len(pings) == 2


async def test_a_reader_of_events_that_all_wait_for_storage_does_not_read_storage(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    gw = gateway_of(client)
    await gw.journal.flush()
    reads: list[Any] = []
    real_read = gw.storage.read_events

    def counting_read(*args: Any) -> Any:
        reads.append(args)
        return real_read(*args)

    gw.storage.read_events = counting_read  # type: ignore[method-assign]
    run_id = "run_fairness_pending"
    gw.journal.open_run(run_id)
    for n in range(5):
        gw.journal.append_nowait(run_id, "message.delta", {"text": f"{n}"}, "test")
    pending = await gw.journal.read(run_id, 0)
    assert [e.seq for e in pending] == [1, 2, 3, 4, 5] and reads == []
    assert [e.seq for e in await gw.journal.read(run_id, 2, 2)] == [3, 4] and reads == []
    await gw.journal.flush()  # committed now: the events come from storage, their frames from memory
    assert [e.seq for e in await gw.journal.read(run_id, 0)] == [1, 2, 3, 4, 5] and len(reads) == 1
    frames = gw.journal.read_frames(run_id, 0, 100)
    assert frames is not None and frames.count == 5 and len(reads) == 1
    await gw.journal.append(run_id, "run.completed", {}, "gateway")
    assert gw.journal.has_terminal(run_id) and "run.completed" in TERMINAL_KINDS


async def test_the_heap_is_trimmed_after_a_run_ends_at_most_once_per_period(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    trimmer = gateway_of(client).heap_trimmer
    assert trimmer._trim is not None  # glibc, as on every machine the tests run on
    await run_to_end(client, run_body("one"))
    async with asyncio.timeout(WAIT):
        while trimmer.trims < 1:  # noqa: ASYNC110 (the trim runs on a worker thread)
            await asyncio.sleep(0.005)
    await run_to_end(client, run_body("two"))  # within IDLE_PASS_EVERY of the first: no second trim yet
    assert trimmer.trims == 1 and trimmer._running is not None and trimmer._running.done()


class _Cycle:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


async def test_garbage_cycles_are_collected_before_the_heap_is_trimmed(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    trimmer = gateway_of(client).heap_trimmer
    cycle = _Cycle()
    freed = weakref.ref(cycle)
    del cycle
    gc.disable()  # only the trimmer's collection may free it
    try:
        await run_to_end(client, run_body("one"))
        async with asyncio.timeout(WAIT):
            while trimmer.trims < 1:  # noqa: ASYNC110 (the trim runs on a worker thread)
                await asyncio.sleep(0.005)
        assert freed() is None and trimmer.collected >= 1
    finally:
        gc.enable()


# -- requests before bulk work (`agent_gateway.server.fairness`) -----------------------------------------


async def test_yield_slice_waits_while_a_request_that_just_arrived_is_unanswered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loaded machine's loop turns must not use up the pause (its bounds have tests of their own).
    monkeypatch.setattr(fairness, "PRIORITY_SECONDS", WAIT)
    requests = fairness.waiting_requests()
    monkeypatch.setattr(requests, "pause_budget", lambda: WAIT)
    connection = object()
    requests.arrived(connection)
    paused = asyncio.create_task(fairness.yield_slice())
    for _ in range(50):  # many loop turns: the slice stays paused while the request waits
        await asyncio.sleep(0)
    assert not paused.done()
    requests.answered(connection)
    await asyncio.wait_for(paused, WAIT)
    assert len(requests) == 0
    # Nothing waiting: one loop turn.
    await asyncio.wait_for(fairness.yield_slice(), WAIT)


async def test_emit_appends_at_once_and_gives_way_while_a_request_that_just_arrived_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime emitting in a tight loop (nothing else suspends it) pauses in `emit`, its event
    appended, while a request waits for its answer; with none waiting, `emit` does not suspend."""
    monkeypatch.setattr(fairness, "PRIORITY_SECONDS", WAIT)  # a loaded machine's turns must not end the pause
    requests = fairness.waiting_requests()
    monkeypatch.setattr(requests, "pause_budget", lambda: WAIT)
    appended: list[str] = []

    async def unused(*_args: Any) -> None:
        raise AssertionError("not called while the journal has room")

    turn = Turn(
        Run("run_give_way", "req", "agent", "bench", "s", "actor", "default"),
        unused,
        [],
        {},
        unused,
        unused,
        emit_nowait=lambda kind, payload, source: appended.append(payload["text"]),
    )
    with pytest.raises(StopIteration):  # nothing waits: emit returns in its first step
        turn.emit("message.delta", {"text": "a"}).send(None)
    connection = object()
    requests.arrived(connection)
    emitting = asyncio.create_task(turn.emit("message.delta", {"text": "b"}))
    for _ in range(50):  # many loop turns: the runtime stays paused while the request waits
        await asyncio.sleep(0)
    assert appended == ["a", "b"] and not emitting.done()
    requests.answered(connection)
    await asyncio.wait_for(emitting, WAIT)


async def test_a_request_holds_slices_back_for_priority_seconds_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fairness, "PRIORITY_SECONDS", 0.05)
    monkeypatch.setattr(fairness, "PAUSE_BUDGET_SECONDS", 1.0)  # (the budget is the next test's)
    requests = fairness.waiting_requests()
    slow = object()
    requests.arrived(slow)  # never answered (a slow handler, a client that sent half a request)
    await asyncio.wait_for(fairness.yield_slice(), WAIT)
    assert requests.time_left() == 0.0  # it no longer counts...
    assert len(requests) == 0  # ...and is forgotten
    await asyncio.wait_for(fairness.yield_slice(), WAIT)


async def test_an_accepted_connection_counts_from_its_accept() -> None:
    requests = fairness.waiting_requests()
    requests.arrived(7)  # the accepted socket's descriptor
    arrived = requests._since[7]
    handler = object()
    requests.moved(7, handler)
    assert requests._since == {handler: arrived}
    requests.moved(8, object())  # nothing waits under 8: nothing moves
    assert requests._since == {handler: arrived}
    requests.answered(handler)
    assert requests.time_left() == 0.0


async def _ping_server() -> tuple[GatewayRunner, GuardedTCPSite]:
    """The gateway's own HTTP server (`GatewayRunner`, `GuardedTCPSite`) answering `GET /ping`."""

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/ping", ping)
    runner = GatewayRunner(app)
    await runner.setup()
    site = GuardedTCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site


@pytest.mark.parametrize("priority", [True, False], ids=["priority", "no-priority"])
async def test_requests_to_the_gateway_server_are_answered_between_two_slices_of_a_busy_runtime(
    priority: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime working through a buffered upstream (slices of ~0.3 ms CPU with `yield_slice`
    between them) on the gateway's own server (`GatewayRunner`, `GuardedTCPSite`): each request,
    on a new connection and on a kept-alive one, is answered while the runtime parks (a slice or
    two: the one before the accept, the one after the answer), not several slices later. The
    `no-priority` case shows what the test tells apart: there each request waits for one slice per
    loop turn it needs (accept, connection, read, handler task)."""
    if not priority:
        monkeypatch.setattr(fairness, "PRIORITY_SECONDS", 0.0)
    slices = 0
    stop = asyncio.Event()

    async def runtime() -> None:
        nonlocal slices
        for _ in range(10_000_000):  # bounded; ends with the test
            if stop.is_set():
                return
            ends = time.perf_counter() + 0.0003
            while time.perf_counter() < ends:  # a slice of parsing
                pass
            slices += 1
            await fairness.yield_slice()

    runner, site = await _ping_server()
    busy = asyncio.create_task(runtime())
    during: list[int] = []
    try:
        async with aiohttp.ClientSession() as http:
            for index in range(40):
                # Even requests go on a new connection (the accept path; the odd one before closed
                # its connection), odd ones on the connection kept alive after it.
                headers = {"Connection": "close"} if index % 2 else {}
                before = slices
                async with http.get(site.name + "/ping", headers=headers) as response:
                    assert response.status == 200
                    await response.read()
                during.append(slices - before)
                await asyncio.sleep(0)
    finally:
        stop.set()
        await busy
        await runner.cleanup()
    assert slices > sum(during)  # the runtime ran between the requests too
    new_connection, kept_alive = sorted(during[0::2]), sorted(during[1::2])
    # Slices counted by the client, which runs in the same loop: its own turns (the request's
    # write, the response's read) take one each.
    if priority:
        assert kept_alive[10] <= 3 and new_connection[10] <= 4, during
    else:  # (measured here: 5 and 9)
        assert kept_alive[10] >= 5 and new_connection[10] >= 7, during


async def test_pauses_take_at_most_their_share_however_many_requests_arrive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of requests that are never answered (connections that send nothing) pauses the
    runtimes only while pause time is left: it is earned at PAUSE_SHARE of the time gone by, up
    to PAUSE_BUDGET_SECONDS, so over a flood pauses and work take turns (half and half).

    Checked on the pauses granted against the time gone by, whatever the machine's load: a pause
    that ends late (the loop waited for a core) is paid back before the next one is granted."""
    monkeypatch.setattr(fairness, "PRIORITY_SECONDS", 60.0)  # every request counts all test long
    requests = fairness.waiting_requests()
    requests.arrived(object())
    assert requests.pause_budget() == pytest.approx(fairness.PAUSE_BUDGET_SECONDS)
    granted: list[float] = []
    taken: list[float] = []
    budget, paused = requests.pause_budget, requests.paused

    def grant() -> float:
        granted.append(budget())
        return granted[-1]

    def take(seconds: float) -> None:
        taken.append(seconds)
        paused(seconds)

    monkeypatch.setattr(requests, "pause_budget", grant)
    monkeypatch.setattr(requests, "paused", take)
    started = time.monotonic()
    for _ in range(21):  # each pause spends what the time since the one before earned
        await asyncio.wait_for(fairness.yield_slice(), WAIT)
    gone_by = time.monotonic() - started
    assert granted[0] == pytest.approx(fairness.PAUSE_BUDGET_SECONDS)
    assert taken[0] >= fairness.PAUSE_BUDGET_SECONDS - 1e-6  # the first pause takes the whole bank
    assert sum(max(0.0, g) for g in granted) <= fairness.PAUSE_BUDGET_SECONDS + fairness.PAUSE_SHARE * gone_by + 1e-6
    assert len(requests) == 1  # the request still counts; the runtime goes on anyway


def _steps_until_over(slices: fairness.WorkSlices, limit: int = 4 * fairness.ARRIVAL_CHECK_STEPS) -> int | None:
    """How many steps the slice takes to end (None: not within `limit`)."""
    for step in range(1, limit + 1):
        if slices.over():
            return step
    return None


async def test_a_slice_ends_within_a_few_steps_of_a_request_reaching_the_gateway() -> None:
    """A slice with time and steps to spare (a minute, a billion steps) ends within
    ARRIVAL_CHECK_STEPS steps of a new connection and of the next request on a kept-alive one,
    and not while nothing arrives: the loop reads the request now, not a slice later."""

    runner, site = await _ping_server()
    port = int(site.name.rsplit(":", 1)[1])
    slices = fairness.WorkSlices(seconds=60.0, steps=1_000_000_000)
    client = socket.create_connection(("127.0.0.1", port), timeout=WAIT)  # (loopback: done before the accept)
    try:
        assert select.select(site._sockets, [], [], WAIT)[0]  # the kernel has it (a level check)
        steps = _steps_until_over(slices)  # the new connection
        assert steps is not None and steps <= fairness.ARRIVAL_CHECK_STEPS
        await slices.next()
        assert runner.server is not None
        for _ in range(1000):  # loop turns until the connection is accepted (bounded)
            if runner.server.connections:
                break
            await asyncio.sleep(0)
        assert runner.server.connections
        (connection,) = runner.server.connections
        assert connection.transport is not None
        server_side = connection.transport.get_extra_info("socket")
        while _steps_until_over(slices) is not None:  # (edges left from the accept, if any)
            await slices.next()
        assert _steps_until_over(slices) is None  # nothing arrives: the slice goes on
        for _ in range(2):  # two requests on the kept-alive connection
            client.sendall(b"GET /ping HTTP/1.1\r\nHost: gateway\r\n\r\n")
            assert select.select([server_side], [], [], WAIT)[0]
            steps = _steps_until_over(slices)
            assert steps is not None and steps <= fairness.ARRIVAL_CHECK_STEPS
            await slices.next()
            answer = await asyncio.to_thread(client.recv, 65536)
            assert answer.startswith(b"HTTP/1.1 200")
            assert _steps_until_over(slices) is None
    finally:
        client.close()
        await runner.cleanup()


def test_an_arrival_check_keeps_the_gil() -> None:
    """A slice asks every few steps whether a request arrived. `select.epoll.poll` would release
    the GIL each time, and a worker thread waiting for it (the journal's writer) would take it:
    the check keeps it. A thread that counts whenever it holds the GIL counts nothing while the
    loop's thread checks 100 times (the switch interval, raised to 0.5 s, is the only other way
    for it to get the GIL, and 100 checks take microseconds)."""
    if not hasattr(select, "epoll"):
        pytest.skip("arrival checks need epoll (Linux)")
    requests = fairness.WaitingRequests()
    ours, peer = socket.socketpair()
    counted = [0]
    stop = threading.Event()

    def count_while_holding_the_gil() -> None:
        while not stop.is_set():
            counted[0] += 1

    interval = sys.getswitchinterval()
    counter = threading.Thread(target=count_while_holding_the_gil)
    try:
        requests.watch(ours.fileno())
        sys.setswitchinterval(0.5)
        counter.start()
        before = counted[0]
        arrived = [requests.arriving() for _ in range(100)]
        after = counted[0]
    finally:
        stop.set()
        sys.setswitchinterval(interval)
        counter.join()
        ours.close()
        peer.close()
    assert arrived == [False] * 100
    assert after == before


async def test_arrivals_are_watched_until_unwatched_and_never_where_epoll_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests = fairness.WaitingRequests()
    ours, peer = socket.socketpair()
    try:
        requests.watch(ours.fileno())
        requests.watch(ours.fileno())  # twice: still one watch
        assert not requests.arriving()
        peer.send(b"x")
        assert requests.arriving()
        assert not requests.arriving()  # one edge, seen once
        requests.unwatch(ours.fileno())
        requests.unwatch(ours.fileno())  # twice: no error
        peer.send(b"y")
        assert not requests.arriving()
        monkeypatch.delattr(select, "epoll")
        elsewhere = fairness.WaitingRequests()
        elsewhere.watch(ours.fileno())
        peer.send(b"z")
        assert not elsewhere.arriving()
    finally:
        ours.close()
        peer.close()
