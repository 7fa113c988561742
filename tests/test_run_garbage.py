"""Runs leave no garbage cycles, and the heap trimmer passes when the last run ends or once a period.

- A run that completes, fails or is cancelled leaves none of the gateway's objects in reference
  cycles once it has ended: what it held is freed by reference counting, without waiting for a
  full collection (which the serving GC thresholds make rare; until then the cycle pins its
  memory, the turn's whole answer text included).
- The heap trimmer's collection and trim run when the last active run ends; a run that ends
  while another is active within the busy period is not followed by a pass (a collection on the
  loop would land in the other run's stream), and a gateway that is never idle collects and trims
  at most once per period. An idle end within the idle period is trimmed at the end of it, unless
  a run is active by then.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from agent_gateway.server.allocator import HeapTrimmer
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway, gateway_of, read_stream, run_body, run_to_end

ENDED = SimpleNamespace(is_terminal=True)


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """The collector off, and every unreachable object it finds kept in `gc.garbage` (returned)."""
    gc.collect()
    gc.garbage.clear()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def forget_garbage(saved: list[object]) -> None:
    """Free what is unreachable now. Clearing `gc.garbage` alone would not: its cycles become
    unreachable again and the next collection would save them again (start-up's JSON Schema
    generators, say, counted as a run's)."""
    gc.set_debug(0)
    saved.clear()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)


def _gateway_types(objects: list[object]) -> Counter[str]:
    """The gateway's own objects among `objects` (the packaged fake upstream's are not the gateway)."""
    return Counter(
        type(o).__qualname__
        for o in objects
        if type(o).__module__.startswith("agent_gateway") and not type(o).__module__.startswith("agent_gateway.testing")
    )


def _without_other_gateways(objects: list[object], keep: object) -> list[object]:
    """`objects` less whatever is linked (either way) to a gateway other than `keep`: an earlier
    test's gateway and its application may become unreachable while this test runs (a worker
    thread that held them ends late on a busy machine); that garbage is not this gateway's runs'."""
    garbage = {id(o): o for o in objects}
    links: dict[int, set[int]] = {i: set() for i in garbage}
    for i, o in garbage.items():
        for referent in gc.get_referents(o):
            j = id(referent)
            if j in garbage and j != i:
                links[i].add(j)
                links[j].add(i)
    others = {i for i, o in garbage.items() if type(o).__qualname__ == "Gateway" and o is not keep}
    stack = list(others)
    while stack:
        for j in links[stack.pop()] - others:
            others.add(j)
            stack.append(j)
    return [o for i, o in garbage.items() if i not in others]


async def test_ended_runs_leave_no_gateway_objects_in_garbage_cycles(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, saved_garbage: list[object]
) -> None:
    client = await make_gateway()
    gw = gateway_of(client)
    await run_to_end(client, run_body("warm-up"))  # one-time start-up garbage is not the runs'
    forget_garbage(saved_garbage)

    ended: list[str] = []
    for n in range(3):
        receipt, events = await run_to_end(client, run_body(f"completed {n}"))
        assert events[-1]["event"] == "run.completed"
        ended.append(receipt["hostRunId"])
    fake_llm.add(Reply(status=500, error_message="upstream broke"))
    receipt, events = await run_to_end(client, run_body("failed"))
    assert events[-1]["event"] == "run.failed"
    ended.append(receipt["hostRunId"])
    fake_llm.add(Reply(text="never finished", hang=True))
    created = await client.post("/v1/runs", json=run_body("cancelled"))
    run_id = (await created.json())["hostRunId"]
    await fake_llm.wait_for_requests(6, timeout=WAIT)  # the warm-up's, 3, the failed one's, this one's
    assert (await client.post(f"/v1/runs/{run_id}/cancel", json={})).status == 202
    assert (await read_stream(client, run_id))[-1]["event"] == "run.cancelled"
    ended.append(run_id)
    async with asyncio.timeout(WAIT):
        for host_run_id in ended:
            await gw.runs.wait(host_run_id)  # _finish done: the run's end is stored, listeners told
    assert gw.runs.active_runs() == []

    gc.collect()
    found = _gateway_types(_without_other_gateways(saved_garbage, gw))
    # A browser guard is made once per application, never by a run: one in the garbage is another
    # test's application's, freed while this test ran (this gateway's own is alive).
    found.pop("BrowserGuard", None)
    assert found == Counter()


async def _hanging_run(client: object, fake_llm: FakeOpenAI) -> str:
    """A run whose upstream never answers, once its request reached the upstream (it is active)."""
    fake_llm.add(Reply(text="never finished", hang=True))
    created = await client.post("/v1/runs", json=run_body("long"))  # type: ignore[attr-defined]
    run_id = str((await created.json())["hostRunId"])
    await fake_llm.wait_for_requests(1, timeout=WAIT)
    return run_id


async def _until_trims(trimmer: HeapTrimmer, count: int) -> None:
    async with asyncio.timeout(WAIT):
        while trimmer.trims < count:  # noqa: ASYNC110 (the trim runs on a worker thread)
            await asyncio.sleep(0.005)


async def test_a_run_ending_while_another_is_active_is_not_followed_by_a_collection(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    gw = gateway_of(client)
    trimmer = gw.heap_trimmer
    assert trimmer._trim is not None  # glibc, as on every machine the tests run on
    trimmer.busy_pass_every = 3600.0  # within the busy period however slow the machine
    long_run = await _hanging_run(client, fake_llm)
    receipt, _ = await run_to_end(client, run_body("short"))
    async with asyncio.timeout(WAIT):
        await gw.runs.wait(receipt["hostRunId"])
    assert (trimmer.collections, trimmer._running) == (0, None)  # the long run is still streaming

    assert (await client.post(f"/v1/runs/{long_run}/cancel", json={})).status == 202
    async with asyncio.timeout(WAIT):
        await gw.runs.wait(long_run)
    assert trimmer.collections == 1  # the last active run ended: the idle pass
    await _until_trims(trimmer, 1)


async def test_a_gateway_that_is_never_idle_collects_and_trims_once_per_period(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    gw = gateway_of(client)
    trimmer = gw.heap_trimmer
    trimmer.busy_pass_every = 0.0  # the period has passed
    long_run = await _hanging_run(client, fake_llm)
    await run_to_end(client, run_body("short"))
    await _until_trims(trimmer, 1)
    assert trimmer.collections == 1
    await client.post(f"/v1/runs/{long_run}/cancel", json={})


async def test_an_idle_end_within_the_period_is_trimmed_when_the_period_ends() -> None:
    trimmer = HeapTrimmer(None, lambda: 0)
    trimmer.idle_pass_every = 1.0
    trimmer.after_run(SimpleNamespace(is_terminal=False))  # a status change, not an end
    assert trimmer.collections == 0
    trimmer.after_run(ENDED)
    trimmer.after_run(ENDED)  # right after the first pass: deferred to the period's end
    assert trimmer.collections == 1 and trimmer._deferred is not None
    async with asyncio.timeout(WAIT):
        while trimmer.collections < 2:  # noqa: ASYNC110 (a timer of the trimmer's)
            await asyncio.sleep(0.01)
    await _until_trims(trimmer, 2)


async def test_a_deferred_pass_is_dropped_when_a_run_is_active_by_then() -> None:
    active = [0]
    trimmer = HeapTrimmer(None, lambda: active[0])
    trimmer.idle_pass_every = 0.5
    trimmer.after_run(ENDED)
    trimmer.after_run(ENDED)
    assert trimmer._deferred is not None
    active[0] = 1  # a run started: the next one to end decides
    async with asyncio.timeout(WAIT):
        while trimmer._deferred is not None:  # noqa: ASYNC110 (a timer of the trimmer's)
            await asyncio.sleep(0.01)
    assert trimmer.collections == 1
    trimmer.stop()
