"""`KeyedLocks`: one lock per key, removed when its last holder or waiter leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agent_gateway.locks import KeyedLocks

WAIT = 5.0


async def until(predicate: Callable[[], bool]) -> None:
    """Let other tasks run until `predicate()` holds (bounded: 100 loop turns)."""
    for _ in range(100):
        if predicate():
            return
        await asyncio.sleep(0)  # one loop turn, so the tasks under test take their next step
    raise AssertionError("the tasks never got there")


async def test_an_entry_lives_only_while_its_key_is_held() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    assert len(locks) == 0 and not locks.locked("a")
    async with locks.hold("a"):
        assert "a" in locks and locks.locked("a") and not locks.locked("b")
        async with locks.hold("b"):  # another key does not wait for "a"
            assert len(locks) == 2
        assert "b" not in locks
    assert len(locks) == 0 and not locks.locked("a")


async def test_an_exception_in_the_block_releases_and_removes_the_entry() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    with pytest.raises(RuntimeError):
        async with locks.hold("a"):
            raise RuntimeError("boom")
    assert len(locks) == 0
    async with asyncio.timeout(WAIT), locks.hold("a"):  # and the key can be taken again at once
        pass


async def test_one_holder_per_key_and_waiters_get_it_in_the_order_they_asked() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    asked: list[int] = []
    inside: list[int] = []
    order: list[int] = []
    most_inside = 0
    release = asyncio.Event()

    async def worker(number: int) -> None:
        nonlocal most_inside
        asked.append(number)  # `hold` queues the task in this same step, before its first await
        async with locks.hold("k"):
            inside.append(number)
            most_inside = max(most_inside, len(inside))
            order.append(number)
            if number == 0:
                await release.wait()  # the others queue up behind the first holder
            await asyncio.sleep(0)  # give a second holder the chance to get in, if it could
            inside.remove(number)

    tasks = [asyncio.create_task(worker(n)) for n in range(6)]
    await until(lambda: len(asked) == 6)
    assert order == [0] and locks.locked("k") and len(locks) == 1
    release.set()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*tasks)
    assert order == list(range(6))
    assert most_inside == 1
    assert len(locks) == 0


async def test_a_waiter_cancelled_while_waiting_leaves_no_entry_and_no_gap() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    got: list[str] = []
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("k"):
            got.append("holder")
            await release.wait()

    async def waiter(name: str) -> None:
        async with locks.hold("k"):
            got.append(name)

    first = asyncio.create_task(holder())
    await until(lambda: got == ["holder"])
    cancelled = asyncio.create_task(waiter("cancelled"))
    after = asyncio.create_task(waiter("after"))
    await until(lambda: _users(locks, "k") == 3)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert locks.locked("k") and len(locks) == 1  # the holder and `after` still count
    release.set()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(first, after)
    assert got == ["holder", "after"]
    assert len(locks) == 0

    # The last waiter cancelled: the entry goes with its holder.
    release.clear()
    first = asyncio.create_task(holder())
    await until(lambda: locks.locked("k"))
    lone = asyncio.create_task(waiter("lone"))
    await until(lambda: _users(locks, "k") == 2)
    lone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lone
    release.set()
    async with asyncio.timeout(WAIT):
        await first
    assert len(locks) == 0


async def test_if_busy_runs_only_when_the_key_is_held_and_the_place_is_kept_meanwhile() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    reports: list[str] = []
    release = asyncio.Event()
    reported = asyncio.Event()
    may_continue = asyncio.Event()

    async def report_queued() -> None:
        reports.append("queued")
        reported.set()
        await may_continue.wait()  # a slow report (a database write) while the holder leaves

    async with locks.hold("k", if_busy=report_queued):
        pass
    assert reports == []  # nobody held the key

    async def holder() -> None:
        async with locks.hold("k"):
            await release.wait()

    first = asyncio.create_task(holder())
    await until(lambda: locks.locked("k"))
    queued = asyncio.create_task(_hold_and_record(locks, "k", report_queued, reports))
    async with asyncio.timeout(WAIT):
        await reported.wait()
    release.set()
    async with asyncio.timeout(WAIT):
        await first
    # The holder left while the queued task was still reporting: its entry stays for it.
    assert "k" in locks and not locks.locked("k")
    may_continue.set()
    async with asyncio.timeout(WAIT):
        await queued
    assert reports == ["queued", "held"]
    assert len(locks) == 0


async def _hold_and_record(
    locks: KeyedLocks[str], key: str, if_busy: Callable[[], Awaitable[None]], reports: list[str]
) -> None:
    async with locks.hold(key, if_busy=if_busy):
        reports.append("held")


def _users(locks: KeyedLocks[str], key: str) -> int:
    """How many tasks hold or wait for `key` (white-box: to know every waiter has queued)."""
    entry = locks._entries.get(key)
    return entry.users if entry is not None else 0
