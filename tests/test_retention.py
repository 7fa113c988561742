"""Retention (``[storage] retain_days``), on SQLite and PostgreSQL: old ended runs go (events,
receipts, digest, and a session left empty), pinned sessions, recent runs and runs still going
stay, deletion goes in bounded steps, and ``config check`` refuses bad values."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from agent_gateway import Event, Run
from agent_gateway.config import Config, ConfigError
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import (
    WAIT,
    MakeGateway,
    gateway_of,
    run_body,
    run_to_end,
    storage_fixture,  # noqa: F401  (the fixture `storage`)
)

DAY_MS = 86_400_000


async def db(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A storage call on a worker thread, as the gateway makes them."""
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))


async def age(client: Any, host_run_id: str, days: float, ended: bool = True) -> None:
    """Make a run look last updated `days` ago (an ended one once its end is stored: its last
    status update would set the time again)."""
    if ended:
        await asyncio.wait_for(gateway_of(client).runs.wait(host_run_id), WAIT)
    updated_at = int(time.time() * 1000 - days * DAY_MS)
    await db(gateway_of(client).storage.update_run, host_run_id, updated_at=updated_at)


async def settle_index(client: Any) -> None:
    response = await client.get("/v1/sessions")  # waits for the session index to catch up
    assert response.status == 200, await response.text()


async def test_old_runs_go_pinned_recent_and_running_ones_stay(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, storage_kind: str
) -> None:
    client = await make_gateway(overrides={"storage": {"retain_days": 7}}, storage=storage_kind)
    gateway = gateway_of(client)
    storage = gateway.storage
    await asyncio.wait_for(gateway.maintenance.swept(), WAIT)  # the start-up sweep found nothing
    runs: dict[str, str] = {}
    sessions: dict[str, str] = {}
    for name in ("old", "pinned", "recent", "shared_old", "shared_recent"):
        fake_llm.add(Reply(text=f"answer of {name}", chunk_size=3))
        body = run_body(f"question {name}")
        if name == "shared_recent":
            body["sessionId"] = sessions["shared_old"]
        receipt, _events = await run_to_end(client, body)
        runs[name], sessions[name] = receipt["hostRunId"], body["sessionId"]
    fake_llm.add(Reply(text="still thinking", hang=True))
    response = await client.post("/v1/runs", json=run_body("a long one"))
    running = (await response.json())["hostRunId"]
    await settle_index(client)
    response = await client.patch(f"/v1/sessions/{sessions['pinned']}", json={"pinned": True})
    assert response.status == 200, await response.text()
    for name in ("old", "pinned", "shared_old"):
        await age(client, runs[name], days=30)
        await db(storage.insert_receipt, {"hostRunId": runs[name], "actorId": "local", "tool": "x"})
    await age(client, runs["recent"], days=6)
    await age(client, running, days=30, ended=False)  # still going: never touched, however old
    kept_events = {name: await db(storage.read_events, runs[name]) for name in ("pinned", "recent")}
    running_events = await gateway.journal.read(running)

    assert await gateway.maintenance.sweep() == 2

    for name in ("old", "shared_old"):
        response = await client.get(f"/v1/runs/{runs[name]}")
        assert response.status == 404, name
        assert await db(storage.read_events, runs[name]) == []
        assert await db(storage.list_receipts, runs[name]) == []
    # A session left without runs is gone; one with a run left keeps it.
    assert (await client.get(f"/v1/sessions/{sessions['old']}")).status == 404
    assert await db(storage.get_session_index, "local", sessions["old"]) is None
    assert (await client.get(f"/v1/sessions/{sessions['shared_old']}")).status == 200
    assert (await client.get(f"/v1/runs/{runs['shared_recent']}")).status == 200
    for name, events in kept_events.items():
        assert await db(storage.read_events, runs[name]) == events, name
    assert len(await db(storage.list_receipts, runs["pinned"])) == 1
    response = await client.get(f"/v1/runs/{running}")
    assert (await response.json())["status"] == "running"
    assert (await gateway.journal.read(running))[: len(running_events)] == running_events
    assert await gateway.maintenance.sweep() == 0  # nothing else is due
    response = await client.post(f"/v1/runs/{running}/cancel", json={})
    assert response.status in (200, 202), await response.text()


async def test_the_background_task_sweeps_at_start_up(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, storage_kind: str, tmp_path: Any
) -> None:
    first = await make_gateway(storage=storage_kind, data_dir=tmp_path)
    receipt, _events = await run_to_end(first, run_body())
    await age(first, receipt["hostRunId"], days=3)
    assert gateway_of(first).maintenance._task is None  # retention off by default: no task at all
    await first.close()
    second = await make_gateway(
        overrides={"storage": {"retain_days": 2}}, storage=storage_kind, data_dir=tmp_path, schema=first.schema
    )
    gateway = gateway_of(second)
    await asyncio.wait_for(gateway.maintenance.swept(), WAIT)
    assert gateway.maintenance.runs_deleted == 1
    assert (await second.get(f"/v1/runs/{receipt['hostRunId']}")).status == 404


def test_a_run_is_deleted_in_bounded_steps_terminal_event_last(storage: Any) -> None:
    host_run_id = "run-" + uuid.uuid4().hex[:10]
    storage.insert_run(Run(host_run_id, "q", "chat-only", "p", "s", "alice", "w", status="completed", updated_at=5))
    events = [Event(host_run_id, seq, "message.delta", "chat-only", {"text": "x"}) for seq in range(1, 10)]
    events.append(Event(host_run_id, 10, "run.completed", "gateway", {}))
    storage.append_events(events)
    assert storage.expired_runs(before_ms=6) == [host_run_id]
    assert storage.expired_runs(before_ms=5) == []
    steps = 0
    for _ in range(10):  # bounded: 3 events per step
        steps += 1
        if storage.delete_run_history(host_run_id, 6, max_events=3):
            break
        # Half deleted, the run still reads as ended: its terminal event goes last.
        assert storage.get_run(host_run_id) is not None
        assert storage.last_event(host_run_id) == events[-1]
    assert steps == 4
    assert storage.get_run(host_run_id) is None
    assert storage.read_events(host_run_id) == []


def test_a_run_no_longer_expired_is_left_alone(storage: Any) -> None:
    host_run_id = "run-" + uuid.uuid4().hex[:10]
    storage.insert_run(Run(host_run_id, "q", "chat-only", "p", "s", "alice", "w", status="running", updated_at=5))
    storage.append_events([Event(host_run_id, 1, "run.started", "gateway", {})])
    assert storage.expired_runs(before_ms=6) == []
    assert storage.delete_run_history(host_run_id, 6) is True  # nothing to do
    assert storage.get_run(host_run_id) is not None
    assert len(storage.read_events(host_run_id)) == 1


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"retain_days": -1}, "storage.retain_days: must be 0"),
        ({"retain_days": float("inf")}, "storage.retain_days: must be 0"),
        ({"retain_days": float("nan")}, "storage.retain_days: must be 0"),
        ({"retain_days": 40_000}, "storage.retain_days: must be 0"),
        ({"retain_days": "30"}, "storage.retain_days: expected float, got str"),
        ({"compact_after_terminal": "yes"}, "storage.compact_after_terminal: expected bool, got str"),
        ({"maintenance_interval_seconds": 0}, "storage.maintenance_interval_seconds: must be a positive"),
    ],
)
def test_config_check_rejects_bad_values(values: dict[str, Any], problem: str) -> None:
    config = Config.load(None, env={}, overrides={"storage": values})
    with pytest.raises(ConfigError) as caught:
        config.check()
    assert any(problem in line for line in caught.value.problems), caught.value.problems


def test_config_accepts_whole_days_and_the_defaults() -> None:
    Config.load(None, env={}, overrides={"storage": {"retain_days": 30, "compact_after_terminal": True}}).check()
    assert Config.load(None, env={}).section("storage")["retain_days"] == 0.0
