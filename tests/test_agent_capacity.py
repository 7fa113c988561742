"""Fair shares of a runtime's agent processes between actors (`max_processes_per_actor`,
`process_wait_seconds`, the eviction rule of `agent_gateway.capacity`).

Through the real gateway with the fake ACP agent (real subprocesses): alice fills her share with
turns that hold until cancelled (the prompt ``hold until cancelled``); bob's runs start at once and
complete, and bob's live binding is never taken (his second turn is `native_live`); alice's extra
run waits (`run.waiting`, status `running`) and runs when one of her turns ends; a wait that runs
out fails the run with the reason. Then the rule itself, on :class:`ProcessCapacity`, and its
wiring in the Pi runtime (unit level: Pi is a real binary the Pi tests drive).

No sleep synchronises: every wait is for an event on a stream, a run's end or a capacity change,
bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from agent_gateway.capacity import CapacityTimeout, ProcessCapacity, ProcessUse
from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.plugins.pi_lab.runtime import Binding as PiBinding
from agent_gateway.plugins.pi_lab.runtime import BindingKey as PiBindingKey
from agent_gateway.plugins.pi_lab.runtime import PiRuntime, PiSettings
from tests._acp import FakeAcpPlugin
from tests._harness import WAIT, MakeGateway, gateway_of, sse_events

AGENT = "fake-acp"
TOKENS = {"tok-alice-0123456789": "alice", "tok-bob-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-0123456789ab"}
HOLD = "hold until cancelled"


def body(message: str, session: str) -> dict[str, Any]:
    return {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": AGENT,
        "sessionId": session,
        "workspaceId": "local:test",
        "message": message,
    }


async def post(client: TestClient, headers: dict[str, str], message: str, session: str) -> str:
    response = await client.post("/v1/runs", json=body(message, session), headers=headers)
    assert response.status == 201, await response.text()
    return str((await response.json())["hostRunId"])


async def receipt(client: TestClient, headers: dict[str, str], run_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{run_id}", headers=headers)
    assert response.status == 200, await response.text()
    return dict(await response.json())


class Stream:
    """A run's SSE stream, read up to an event of a kind, then on to its end."""

    def __init__(self, client: TestClient, headers: dict[str, str], run_id: str) -> None:
        self.client, self.headers, self.run_id = client, headers, run_id
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Stream:
        self._response = await self.client.get(f"/v1/runs/{self.run_id}/stream", headers=self.headers)
        assert self._response.status == 200, await self._response.text()
        self._iter: AsyncIterator[dict[str, Any]] = sse_events(self._response).__aiter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._response.close()

    async def until(self, kind: str) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            while True:
                try:
                    event = (await anext(self._iter))["data"]
                except StopAsyncIteration:
                    raise AssertionError(f"ended before {kind}: {[e['kind'] for e in self.events]}") from None
                self.events.append(event)
                if event["kind"] == kind:
                    return event

    async def to_end(self) -> list[dict[str, Any]]:
        async with asyncio.timeout(WAIT):
            async for item in self._iter:
                self.events.append(item["data"])
        kinds = [e["kind"] for e in self.events]
        assert kinds and kinds[-1] in TERMINAL_KINDS and sum(k in TERMINAL_KINDS for k in kinds) == 1, kinds
        return self.events


async def run_through(client: TestClient, headers: dict[str, str], message: str, session: str) -> dict[str, Any]:
    """A run to its end: its final receipt, with its events under ``"events"``."""
    run_id = await post(client, headers, message, session)
    async with Stream(client, headers, run_id) as stream:
        events = await stream.to_end()
    return {**await receipt(client, headers, run_id), "events": events}


async def cancel(client: TestClient, headers: dict[str, str], run_id: str) -> None:
    response = await client.post(f"/v1/runs/{run_id}/cancel", json={}, headers=headers)
    assert response.status in (200, 202), await response.text()


def mode_of(events: list[dict[str, Any]]) -> str:
    modes = [e["payload"]["sessionMode"] for e in events if e["kind"] == "session.info.updated"]
    assert len(modes) == 1, modes
    return str(modes[0])


# -- through the gateway -------------------------------------------------------------------------------


async def test_one_actors_slow_turns_never_fail_or_evict_another_actors_runs(make_gateway: MakeGateway) -> None:
    plugin = FakeAcpPlugin("basic", max_processes=4, max_processes_per_actor=2, process_wait_seconds=WAIT * 10)
    client = await make_gateway(tokens=TOKENS, extra_plugins=(plugin,))
    runtime = gateway_of(client).runtimes[AGENT]

    first_bob = await run_through(client, BOB, "hello", "bob-1")
    assert first_bob["status"] == "completed"

    # Alice fills her share with two turns that stay busy.
    holding = [await post(client, ALICE, HOLD, f"alice-{i}") for i in (1, 2)]
    for run_id in holding:
        async with Stream(client, ALICE, run_id) as stream:
            await stream.until("thought.delta")

    # Her third run waits for a process of her own; it does not fail.
    extra = await post(client, ALICE, "one more", "alice-3")
    async with Stream(client, ALICE, extra) as stream:
        waiting = await stream.until("run.waiting")
    assert waiting["payload"]["reason"] == "agent_capacity"
    assert "max_processes_per_actor" in waiting["payload"]["message"]
    assert (await receipt(client, ALICE, extra))["status"] == "running"

    # Bob meanwhile: his live binding is still his (native_live), and a new session starts at once.
    bob_process = next(b.process for b in runtime._bindings.values() if b.key.actor_id == "bob")
    second_bob = await run_through(client, BOB, "again", "bob-1")
    assert second_bob["status"] == "completed"
    assert mode_of(second_bob["events"]) == "native_live"
    assert second_bob["providerRunId"] == first_bob["providerRunId"]
    other_bob = await run_through(client, BOB, "elsewhere", "bob-2")
    assert other_bob["status"] == "completed" and mode_of(other_bob["events"]) == "new_session"
    assert (await receipt(client, ALICE, extra))["status"] == "running"  # still waiting

    # One of alice's turns ends: her waiting run gets a process (her idle one is closed) and runs.
    await cancel(client, ALICE, holding[0])
    async with Stream(client, ALICE, extra) as stream:
        events = await stream.to_end()
    done = await receipt(client, ALICE, extra)
    assert done["status"] == "completed", done
    kinds = [e["kind"] for e in events]
    assert kinds.count("run.waiting") == 1 and kinds.index("run.waiting") < kinds.index("message.completed")
    assert not bob_process.closed  # alice never took bob's binding
    assert sum(1 for b in runtime._bindings.values() if b.key.actor_id == "bob" and b.alive) == 2

    await cancel(client, ALICE, holding[1])
    async with Stream(client, ALICE, holding[1]) as stream:
        assert (await stream.to_end())[-1]["kind"] == "run.cancelled"


async def test_a_wait_that_runs_out_fails_the_run_with_the_reason(make_gateway: MakeGateway) -> None:
    plugin = FakeAcpPlugin("basic", max_processes=4, max_processes_per_actor=1, process_wait_seconds=0.2)
    client = await make_gateway(tokens=TOKENS, extra_plugins=(plugin,))
    held = await post(client, ALICE, HOLD, "alice-1")
    async with Stream(client, ALICE, held) as stream:
        await stream.until("thought.delta")

    run = await run_through(client, ALICE, "no room", "alice-2")
    assert run["status"] == "failed"
    terminal = run["events"][-1]
    assert terminal["kind"] == "run.failed"
    reason = terminal["payload"]["reason"]
    assert "max_processes_per_actor" in reason and "process_wait_seconds" in reason, reason
    assert run["error"] == reason
    # Bob is not held back by alice's limit.
    assert (await run_through(client, BOB, "hello", "bob-1"))["status"] == "completed"

    await cancel(client, ALICE, held)
    async with Stream(client, ALICE, held) as stream:
        assert (await stream.to_end())[-1]["kind"] == "run.cancelled"


# -- the rule ------------------------------------------------------------------------------------------


def use(actor: str, busy: bool, last_used: float) -> ProcessUse:
    return ProcessUse(actor, busy, last_used, f"{actor}@{last_used:g}")


def test_an_actor_at_its_limit_may_close_only_its_own_idle_binding() -> None:
    capacity = ProcessCapacity("agent", 4, 2, 1.0)
    uses = [use("alice", True, 1), use("alice", False, 2), use("bob", False, 0)]
    assert capacity.decide("alice", uses) == (False, uses[1])
    assert capacity.decide("alice", [uses[0], use("alice", True, 2), uses[2]]) == (False, None)  # wait
    assert capacity.decide("bob", uses) == (True, None)  # room: 3 of 4


def test_a_full_runtime_closes_own_idle_then_idle_of_actors_above_their_fair_share() -> None:
    capacity = ProcessCapacity("agent", 4, 0, 1.0)  # 0: no per-actor limit
    uses = [use("alice", True, 1), use("alice", False, 5), use("alice", False, 3), use("bob", False, 2)]
    assert capacity.decide("bob", uses) == (False, uses[3])  # his own first
    # carol: fair share 4 // 3 = 1; alice holds 3 (above), bob 1 (within): alice's oldest idle goes.
    assert capacity.decide("carol", uses) == (False, uses[2])
    # Nobody above the share has an idle binding: wait, whatever bob's idle binding.
    busy = [use("alice", True, 1), use("alice", True, 5), use("bob", False, 2), use("dave", True, 4)]
    assert capacity.decide("carol", busy) == (False, None)


async def test_waiting_requests_are_served_first_come_unless_the_first_cannot_use_the_room() -> None:
    capacity = ProcessCapacity("agent", 2, 1, WAIT)
    live = [use("alice", True, 1), use("bob", True, 2)]
    closed: list[Any] = []

    async def close(binding: Any, why: str) -> None:
        closed.append(binding)
        live[:] = [u for u in live if u.binding != binding]
        capacity.changed()

    order: list[str] = []
    waiting = {"alice": asyncio.Event(), "carol": asyncio.Event()}

    async def ask(actor: str) -> None:
        async def on_wait(message: str) -> None:
            waiting[actor].set()

        await capacity.make_room(actor, lambda: list(live), close, on_wait=on_wait)
        order.append(actor)
        live.append(use(actor, True, 9))

    carol = asyncio.create_task(ask("carol"))
    alice = asyncio.create_task(ask("alice"))
    async with asyncio.timeout(WAIT):
        await asyncio.gather(waiting["carol"].wait(), waiting["alice"].wait())
    # Alice's turn ends. Carol, first in line, may not close it (alice holds 1, her fair share);
    # alice, at her own limit, closes it for her next process, and the room is hers.
    live[0] = use("alice", False, 1)
    capacity.changed()
    async with asyncio.timeout(WAIT):
        await alice
    assert order == ["alice"] and closed == ["alice@1"]
    # Bob's binding ends: carol, first in line, gets the room before a newcomer.
    live[:] = [u for u in live if u.actor_id != "bob"]
    capacity.changed()
    async with asyncio.timeout(WAIT):
        await carol
    assert order == ["alice", "carol"]


async def test_a_wait_is_bounded() -> None:
    capacity = ProcessCapacity("agent", 1, 1, 0.05)
    waited: list[str] = []

    async def on_wait(message: str) -> None:
        waited.append(message)

    async def close(binding: Any, why: str) -> None:
        raise AssertionError("a busy binding is never closed")

    try:
        async with asyncio.timeout(WAIT):
            await capacity.make_room("alice", lambda: [use("bob", True, 1)], close, on_wait=on_wait)
    except CapacityTimeout as exc:
        assert "max_processes" in str(exc) and "process_wait_seconds" in str(exc)
    else:
        raise AssertionError("the wait should have run out")
    assert len(waited) == 1 and capacity.waiting == 0


# -- Pi ------------------------------------------------------------------------------------------------


class _FakePiProcess:
    alive = True

    async def close(self) -> None:
        self.alive = False


async def test_pi_counts_its_processes_per_actor_and_closes_only_idle_ones(tmp_path: Path) -> None:
    settings = PiSettings(["pi"], {}, tmp_path, max_processes=2, max_processes_per_actor=1, process_wait_seconds=WAIT)
    runtime = PiRuntime(settings)
    assert runtime.capacity.max_per_actor == 1

    def bind(actor: str, busy: bool) -> PiBinding:
        key = PiBindingKey(actor, f"s-{actor}", "w", (), "m")
        binding = PiBinding(key, _FakePiProcess(), "pi-session", "file", turn=object() if busy else None)  # type: ignore[arg-type]
        runtime.bindings[key.astuple()] = binding
        return binding

    alice, bob = bind("alice", busy=False), bind("bob", busy=True)
    uses = runtime._process_uses()
    assert {(u.actor_id, u.busy) for u in uses} == {("alice", False), ("bob", True)}
    # Alice at her limit: her own idle binding is closed for her next one; bob's busy one never.
    async with asyncio.timeout(WAIT), runtime.capacity.reserve("alice", runtime._process_uses, runtime._close):
        assert alice.closed and not bob.closed
        assert runtime.capacity.decide("carol", runtime._process_uses())[0] is False  # alice's start counts
