"""The generic ACP runtime (agent_gateway.acp.runtime) through the real gateway HTTP API.

Every test registers an :class:`AcpRuntime` for one of the fake ACP agents
(``contrib.fake_acp_agents``, real subprocesses) with an in-test plugin, then drives it with
``POST /v1/runs``, the SSE stream, ``GET /v1/runs/{id}``, ``/cancel``, ``/permissions`` and
``GET /v1/agents``. A restart is a second gateway app on the same data dir.

No sleep is used to synchronise: tests wait for events on the stream, for a run to end, or for an
agent process to close, and every wait is bounded (``WAIT``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpRuntime, Binding
from agent_gateway.models import TERMINAL_KINDS
from tests._acp import AGENT, FakeAcpPlugin, body, receipt, turn
from tests._harness import WAIT, MakeGateway, events_page, gateway_of, sse_events

PACKET_HEADER = "[Earlier turns of this conversation"


# -- the in-test plugin -------------------------------------------------------------------------------


async def gateway_with(make_gateway: MakeGateway, *plugins: FakeAcpPlugin, data_dir: Path | None = None) -> TestClient:
    # A test that compares the agent's own pids with the gateway's (FAKE_ACP_STARTED) runs it
    # unconfined: inside its sandbox an agent has a PID namespace of its own.
    overrides = {"sandbox": {"mode": "off"}} if any("FAKE_ACP_STARTED" in p.env for p in plugins) else {}
    return await make_gateway(extra_plugins=plugins, data_dir=data_dir, overrides=overrides)


def runtime_of(client: TestClient, agent_id: str = AGENT) -> AcpRuntime:
    runtime = gateway_of(client).runtimes[agent_id]
    assert isinstance(runtime, AcpRuntime)
    return runtime


def binding_of(client: TestClient, session_id: str, agent_id: str = AGENT) -> Binding:
    runtime = runtime_of(client, agent_id)
    bindings = [b for b in runtime._bindings.values() if b.key.session_id == session_id]
    assert len(bindings) == 1, f"expected one live binding for {session_id}, found {len(bindings)}"
    return bindings[0]


# -- run helpers --------------------------------------------------------------------------------------


async def post(client: TestClient, message: str, session: str = "s1", **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=body(message, session, **fields))
    assert response.status == 201, await response.text()
    return dict(await response.json())


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


def live_text(events: list[dict[str, Any]]) -> str:
    """The assistant text the agent streamed in this run (never replayed history)."""
    return "".join(e["payload"]["text"] for e in events if e["kind"] == "message.delta")


def completed_text(events: list[dict[str, Any]]) -> str:
    done = of_kind(events, "message.completed")
    assert len(done) == 1, [e["kind"] for e in events]
    return str(done[0]["payload"]["text"])


def terminal(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events[-1]["kind"] in TERMINAL_KINDS
    return events[-1]


def assert_mode(run: dict[str, Any], events: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """The mode is on the receipt and in a `session.info.updated` event; returns that event's payload."""
    assert run["sessionMode"] == mode, run
    mode_events = [e for e in of_kind(events, "session.info.updated") if "sessionMode" in e["payload"]]
    assert [e["payload"]["sessionMode"] for e in mode_events] == [mode], mode_events
    assert mode_events[0]["source"] == "gateway"
    return dict(mode_events[0]["payload"])


class LiveStream:
    """An SSE stream read step by step: wait for a kind, act, then read on to the end."""

    def __init__(self, client: TestClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> LiveStream:
        self._response = await self.client.get(f"/v1/runs/{self.run_id}/stream")
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
                    raise AssertionError(f"stream ended before {kind}: {[e['kind'] for e in self.events]}") from None
                self.events.append(event)
                if event["kind"] == kind:
                    return event

    async def to_end(self) -> list[dict[str, Any]]:
        async with asyncio.timeout(WAIT):
            async for item in self._iter:
                self.events.append(item["data"])
        assert self.events and self.events[-1]["kind"] in TERMINAL_KINDS, [e["kind"] for e in self.events]
        assert sum(e["kind"] in TERMINAL_KINDS for e in self.events) == 1
        return self.events


async def wait_run(client: TestClient, run_id: str) -> None:
    async with asyncio.timeout(WAIT):
        await gateway_of(client).runs.wait(run_id)


async def agent_descriptor(client: TestClient, agent_id: str = AGENT) -> dict[str, Any]:
    response = await client.get("/v1/agents")
    assert response.status == 200
    listing = await response.json()
    return next(a for a in listing["agents"] if a["agentId"] == agent_id)


async def restart(
    make_gateway: MakeGateway, client: TestClient, plugin: FakeAcpPlugin, wipe: Path | None = None
) -> TestClient:
    """Stop this gateway (its agent processes with it) and start a new one on the same data dir;
    `wipe` (the agent's state dir) is emptied in between, as if the agent forgot its sessions."""
    data_dir = gateway_of(client).data_dir
    await client.close()
    if wipe is not None:
        await asyncio.to_thread(shutil.rmtree, wipe)
    return await gateway_with(make_gateway, plugin, data_dir=data_dir)


# -- ACP transport through the gateway ------------------------------------------------------------------


async def test_unknown_update_kept_and_nonstandard_stop_reason_fails(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("weird"))
    run, events = await turn(client, "hello")
    assert run["status"] == "failed"
    assert "teapot" in run["error"], run["error"]
    end = terminal(events)
    assert end["kind"] == "run.failed" and end["payload"]["stopReason"] == "teapot"
    unknown = of_kind(events, "agent.update")
    assert [u["payload"] for u in unknown] == [
        {"raw": {"sessionUpdate": "teapot_update", "temperature": 97, "spout": ["short", "stout"]}}
    ]
    assert unknown[0]["source"] == AGENT
    # in order: the unknown update sits between the two chunks it was sent between
    kinds = [e["kind"] for e in events if e["kind"] in ("message.delta", "agent.update")]
    assert kinds == ["message.delta", "agent.update", "message.delta"]
    assert live_text(events) == "brewing tea"


async def test_jsonrpc_error_on_prompt_fails_with_agent_words_and_next_turn_recovers(
    make_gateway: MakeGateway,
) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic"))
    first, _ = await turn(client, "hello")
    assert first["status"] == "completed"
    # The agent forgets its session (as after an agent-side expiry): its next prompt is an error.
    binding = binding_of(client, "s1")
    async with asyncio.timeout(WAIT):
        await binding.process.close_session(first["providerRunId"])
    second, events = await turn(client, "again")
    assert second["status"] == "failed"
    assert "-32002" in second["error"] and "Resource not found" in second["error"], second["error"]
    assert terminal(events)["payload"]["agentError"]["code"] == -32002
    # The binding whose session the agent no longer knows is not reused for ever.
    third, events = await turn(client, "third")
    assert third["status"] == "completed", third
    assert third["providerRunId"] != first["providerRunId"]
    assert third["sessionMode"] in ("cold_resumed", "new_session")
    assert completed_text(events).startswith("echo: ")


async def test_jsonrpc_error_while_opening_session_fails_with_agent_words(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic"))
    run, events = await turn(client, "hello", options={"model": "no-such-model"})
    assert run["status"] == "failed" and terminal(events)["kind"] == "run.failed"
    assert "Invalid params" in run["error"] and "-32602" in run["error"], run["error"]
    assert runtime_of(client).live_bindings() == 0
    # a valid model then works in the same session
    run, _ = await turn(client, "hello", options={"model": "fake-large"})
    assert run["status"] == "completed"


async def test_update_order_preserved_under_a_flood(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("flood"))
    count = 3000
    run, events = await turn(client, f"flood {count} numbered")
    assert run["status"] == "completed"
    expected = "".join(f"{i}," for i in range(count))
    assert live_text(events) == expected
    assert completed_text(events) == expected
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_multi_megabyte_line_passes(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("weird"))
    created = await post(client, "big")
    await wait_run(client, created["hostRunId"])
    run = await receipt(client, created["hostRunId"])
    assert run["status"] == "completed", run
    events = await events_page(client, created["hostRunId"])
    assert len(live_text(events)) == 5 * 1024 * 1024
    assert set(live_text(events)) == {"y"}


async def test_chatty_stderr_never_blocks(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("stderr_flood"))
    run, events = await turn(client, "hello")
    assert run["status"] == "completed"
    assert completed_text(events) == "echo: hello"


async def test_crash_mid_turn_fails_with_exit_code_and_stderr_then_new_process(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("crash"))
    created = await post(client, "hello")
    async with LiveStream(client, created["hostRunId"]) as stream:
        await stream.until("message.delta")
        process = binding_of(client, "s1").process
        events = await stream.to_end()
    run = await receipt(client, created["hostRunId"])
    assert run["status"] == "failed"
    assert "exited with code 3" in run["error"], run["error"]
    assert "simulated crash in the middle of a turn" in run["error"]
    assert terminal(events)["payload"]["exitCode"] == 3
    assert live_text(events) == "about to crash"  # what it said before dying is kept
    assert process.returncode == 3
    assert runtime_of(client).live_bindings() == 0
    # The next turn starts a new process (which crashes the same way: the behaviour always does).
    created = await post(client, "again")
    async with LiveStream(client, created["hostRunId"]) as stream:
        await stream.until("message.delta")
        assert binding_of(client, "s1").process is not process
        events = await stream.to_end()
    again = await receipt(client, created["hostRunId"])
    assert again["status"] == "failed" and "exited with code 3" in again["error"]
    assert live_text(events) == "about to crash"  # the new process took the prompt
    assert again["providerRunId"] != run["providerRunId"]


async def test_killed_agent_fails_the_run_and_next_turn_recovers(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic", delay=0.3))
    created = await post(client, "hello")
    async with LiveStream(client, created["hostRunId"]) as stream:
        await stream.until("thought.delta")
        process = binding_of(client, "s1").process
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        events = await stream.to_end()
    run = await receipt(client, created["hostRunId"])
    assert run["status"] == "failed"
    assert f"code {-signal.SIGKILL}" in run["error"], run["error"]
    assert terminal(events)["payload"]["exitCode"] == -signal.SIGKILL
    again, events = await turn(client, "again")
    assert again["status"] == "completed"
    assert again["providerRunId"] != run["providerRunId"]
    assert binding_of(client, "s1").process is not process
    assert completed_text(events) == "echo: again"


# -- negotiated policy ----------------------------------------------------------------------------------


async def test_policy_negotiated_from_initialize(make_gateway: MakeGateway) -> None:
    basic = FakeAcpPlugin("basic", agent_id="fake-basic")
    replay = FakeAcpPlugin("replay", agent_id="fake-replay")
    client = await gateway_with(make_gateway, basic, replay)
    for agent_id in ("fake-basic", "fake-replay"):
        before = await agent_descriptor(client, agent_id)
        assert before["policy"]["loadSession"] is False and "negotiated" not in before["policy"]
        run, _ = await turn(client, "hello", session=f"s-{agent_id}", agent_id=agent_id)
        assert run["status"] == "completed"
    basic_policy = (await agent_descriptor(client, "fake-basic"))["policy"]
    replay_policy = (await agent_descriptor(client, "fake-replay"))["policy"]
    assert basic_policy["negotiated"] is True and replay_policy["negotiated"] is True
    assert basic_policy["loadSession"] is False and replay_policy["loadSession"] is True
    # the fake agents declare stdio MCP only (no mcpCapabilities.http)
    assert basic_policy["mcpHttp"] is False and replay_policy["mcpHttp"] is False
    assert set(basic_policy) == {"contextCarrier", "loadSession", "mcpHttp", "canRollback", "clientTools", "negotiated"}
    assert (await agent_descriptor(client, "fake-basic"))["liveBindings"] == 1


# -- live bindings ------------------------------------------------------------------------------------


async def test_live_binding_reused_turn_after_turn(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic"))
    first, events = await turn(client, "hello")
    info = assert_mode(first, events, "new_session")
    assert first["status"] == "completed" and first["providerRunId"]
    assert info["agentSessionId"] == first["providerRunId"]
    process = binding_of(client, "s1").process
    assert not process.closed  # a finished turn does not close the binding
    second, events = await turn(client, "history?")
    assert_mode(second, events, "native_live")
    assert second["providerRunId"] == first["providerRunId"]
    assert binding_of(client, "s1").process is process
    assert completed_text(events) == "hello"  # the agent kept its own history
    third, events = await turn(client, "again")
    assert_mode(third, events, "native_live")
    assert third["providerRunId"] == first["providerRunId"]
    assert runtime_of(client).live_bindings() == 1


async def test_cancel_stops_the_prompt_not_the_binding(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic", delay=0.3))
    created = await post(client, "a slow answer please")
    async with LiveStream(client, created["hostRunId"]) as stream:
        await stream.until("thought.delta")
        process = binding_of(client, "s1").process
        response = await client.post(f"/v1/runs/{created['hostRunId']}/cancel", json={})
        assert response.status in (200, 202)
        events = await stream.to_end()
    run = await receipt(client, created["hostRunId"])
    assert run["status"] == "cancelled"
    end = terminal(events)
    assert end["kind"] == "run.cancelled"
    assert end["payload"]["stopReason"] == "cancelled"  # the agent itself stopped (session/cancel)
    assert not process.closed
    assert binding_of(client, "s1").process is process
    after, events = await turn(client, "next")
    assert_mode(after, events, "native_live")
    assert after["providerRunId"] == run["providerRunId"]
    assert after["status"] == "completed"
    assert completed_text(events) == "echo: next"


@pytest.mark.parametrize(
    "change",
    [
        {"workspaceId": "local:other"},
        {"context": {"allowedRoots": ["notes/"]}},
        {"options": {"model": "fake-large"}},
        {"options": {"profile": "careful"}},
    ],
    ids=["workspace", "allowedRoots", "model", "profile"],
)
async def test_key_change_closes_the_binding(make_gateway: MakeGateway, change: dict[str, Any]) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic"))
    first, _ = await turn(client, "hello")
    old = binding_of(client, "s1").process
    same, events = await turn(client, "again")
    assert_mode(same, events, "native_live")
    changed, events = await turn(client, "changed", **change)
    assert changed["status"] == "completed"
    assert changed["providerRunId"] != first["providerRunId"]  # a new agent session
    info = assert_mode(changed, events, "cold_resumed")
    assert info["previousAgentSessionId"] == first["providerRunId"]
    async with asyncio.timeout(WAIT):
        await old.wait_closed()
    assert old.closed and binding_of(client, "s1").process is not old
    assert runtime_of(client).live_bindings() == 1
    # the new binding is live for the new key
    again, events = await turn(client, "more", **change)
    assert_mode(again, events, "native_live")
    assert again["providerRunId"] == changed["providerRunId"]


async def test_idle_binding_evicted_after_idle_seconds(make_gateway: MakeGateway) -> None:
    # Long enough that the binding is still there when the client has read the turn's end on a
    # busy machine (at 0.5 s it was sometimes evicted before `binding_of` looked).
    idle = 3.0
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic", idle_seconds=idle))
    first, _ = await turn(client, "hello")
    binding = binding_of(client, "s1")
    # The idle clock starts when the turn ends in the gateway (this process), not when the client
    # has seen it end: a loop stall in between (a fork, a loaded machine) would shorten the gap.
    ended = binding.last_used
    async with asyncio.timeout(WAIT):
        await binding.process.wait_closed()
    assert time.monotonic() - ended >= idle * 0.8
    assert runtime_of(client).live_bindings() == 0
    assert (await agent_descriptor(client))["liveBindings"] == 0
    second, events = await turn(client, "again")
    assert second["providerRunId"] != first["providerRunId"]
    assert_mode(second, events, "cold_resumed")  # `basic` cannot load: a new session with the packet


async def test_max_processes_evicts_the_least_recently_used_idle_binding(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic", max_processes=1))
    a1, _ = await turn(client, "hello", session="A")
    process_a = binding_of(client, "A").process
    b1, events = await turn(client, "hello", session="B")
    assert_mode(b1, events, "new_session")
    async with asyncio.timeout(WAIT):
        await process_a.wait_closed()
    assert runtime_of(client).live_bindings() == 1
    process_b = binding_of(client, "B").process
    assert not process_b.closed
    a2, events = await turn(client, "again", session="A")
    assert a2["status"] == "completed" and a2["providerRunId"] != a1["providerRunId"]
    assert_mode(a2, events, "cold_resumed")
    async with asyncio.timeout(WAIT):
        await process_b.wait_closed()
    assert runtime_of(client).live_bindings() == 1


async def test_one_prompt_at_a_time_per_agent_session(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("reject_concurrent", delay=0.3))
    first = await post(client, "first")
    second = await post(client, "second")
    async with LiveStream(client, second["hostRunId"]) as stream:
        queued = await stream.until("run.queued")
        assert queued["source"] == "gateway"
        assert (await receipt(client, second["hostRunId"]))["status"] == "queued"
        second_events = await stream.to_end()
    await wait_run(client, first["hostRunId"])
    one, two = await receipt(client, first["hostRunId"]), await receipt(client, second["hostRunId"])
    assert one["status"] == "completed" and two["status"] == "completed", (one, two)
    assert_mode(two, second_events, "native_live")
    assert two["providerRunId"] == one["providerRunId"]
    assert completed_text(second_events) == "echo: second"
    kinds = [e["kind"] for e in second_events]
    assert kinds.index("run.queued") < kinds.index("run.started")


# -- without a live binding (restart) -------------------------------------------------------------------


async def test_restart_loads_with_replay_evidence(make_gateway: MakeGateway, tmp_path: Path) -> None:
    state = tmp_path / "agent-state"
    client = await gateway_with(make_gateway, FakeAcpPlugin("replay", state_dir=state))
    # With a target the prompt the agent saw differs from the user's message: the agent will replay
    # a user message the transcript does not hold word for word.
    first, _ = await turn(client, "hello", context={"target": {"path": "notes/a.md"}})
    second, _ = await turn(client, "second")
    assert first["providerRunId"] == second["providerRunId"]

    client = await restart(make_gateway, client, FakeAcpPlugin("replay", state_dir=state))
    run, events = await turn(client, "history?")
    assert run["status"] == "completed"
    info = assert_mode(run, events, "loaded")
    assert run["providerRunId"] == first["providerRunId"] == info["agentSessionId"]
    replayed = [e for e in events if e["source"] == "adapter_replay"]
    assert {e["kind"] for e in replayed} == {"replay.message", "session.replayed"}
    summary = of_kind(replayed, "session.replayed")[0]["payload"]
    assert summary["messages"] == 4 and summary["deduplicated"] == 3 and summary["journalled"] == 1
    assert info["replay"] == summary
    assert [e["payload"] for e in of_kind(replayed, "replay.message")] == [
        {"role": "user", "text": "[Current page: notes/a.md]\n\nhello"}
    ]
    # replayed history is never new output
    assert all(e["source"] == AGENT for e in of_kind(events, "message.delta"))
    assert live_text(events) == completed_text(events) == "[Current page: notes/a.md]\n\nhello|second"
    assert "echo: second" not in live_text(events)
    # and the loaded session is live from now on
    again, events = await turn(client, "again")
    assert_mode(again, events, "native_live")
    assert again["providerRunId"] == first["providerRunId"]


async def test_restart_with_forgotten_agent_session_cold_resumes(make_gateway: MakeGateway, tmp_path: Path) -> None:
    state = tmp_path / "agent-state"
    client = await gateway_with(make_gateway, FakeAcpPlugin("replay", state_dir=state))
    first, _ = await turn(client, "remember the blue door")
    client = await restart(make_gateway, client, FakeAcpPlugin("replay", state_dir=state), wipe=state)
    run, events = await turn(client, "which door?")
    assert run["status"] == "completed"
    info = assert_mode(run, events, "cold_resumed")
    assert info["previousAgentSessionId"] == first["providerRunId"] and info["loadAttempted"] is True
    assert run["providerRunId"] != first["providerRunId"]
    assert not [e for e in events if e["source"] == "adapter_replay"]
    reply = completed_text(events)
    assert reply.startswith("echo: " + PACKET_HEADER), reply
    assert "User: remember the blue door" in reply and "Assistant: echo: remember the blue door" in reply
    assert reply.endswith("which door?")


async def test_silent_load_is_not_loaded_but_cold_resumed(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("silent_load"))
    first, _ = await turn(client, "remember the blue door")
    assert (await agent_descriptor(client))["policy"]["loadSession"] is True
    client = await restart(make_gateway, client, FakeAcpPlugin("silent_load"))
    run, events = await turn(client, "which door?")
    assert run["status"] == "completed"
    info = assert_mode(run, events, "cold_resumed")
    assert info["loadAttempted"] is True and info["previousAgentSessionId"] == first["providerRunId"]
    assert run["providerRunId"] != first["providerRunId"]
    reply = completed_text(events)
    assert reply.startswith("echo: " + PACKET_HEADER), reply
    assert "User: remember the blue door" in reply


async def test_restart_without_load_support_cold_resumes(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic"))
    first, _ = await turn(client, "remember the blue door")
    client = await restart(make_gateway, client, FakeAcpPlugin("basic"))
    run, events = await turn(client, "which door?")
    info = assert_mode(run, events, "cold_resumed")
    assert info["loadAttempted"] is False and info["previousAgentSessionId"] == first["providerRunId"]
    assert "User: remember the blue door" in completed_text(events)


async def test_bare_short_reply_on_new_session_gets_a_context_warning(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("basic"))
    run, events = await turn(client, "可以")
    assert run["status"] == "completed"
    assert_mode(run, events, "new_session")
    warnings = of_kind(events, "context.warning")
    assert len(warnings) == 1 and "short reply" in warnings[0]["payload"]["message"]
    # with context, or with earlier turns, it is not a warning
    run, events = await turn(client, "可以", session="s2", context={"target": {"path": "notes/today.md"}})
    assert_mode(run, events, "new_session")
    assert not of_kind(events, "context.warning")
    run, events = await turn(client, "可以")
    assert_mode(run, events, "native_live")
    assert not of_kind(events, "context.warning")


# -- the permission loop --------------------------------------------------------------------------------


async def test_permission_requested_and_answered(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("permission"))
    created = await post(client, "write it")
    run_id = created["hostRunId"]
    async with LiveStream(client, run_id) as stream:
        asked = (await stream.until("permission.requested"))["payload"]
        assert [o["optionId"] for o in asked["options"]] == ["allow_once", "reject_once"]
        assert [o["kind"] for o in asked["options"]] == ["allow_once", "reject_once"]
        assert asked["toolCall"]["kind"] == "edit" and asked["toolCall"]["toolCallId"] == "call-1"
        assert (await receipt(client, run_id))["status"] == "awaiting_permission"
        request_id = asked["requestId"]
        wrong = await client.post(f"/v1/runs/{run_id}/permissions/{request_id}", json={"optionId": "allow_forever"})
        assert wrong.status == 400
        assert (await wrong.json())["error"]["code"] == "invalid_option"
        unknown = await client.post(f"/v1/runs/{run_id}/permissions/perm_nope", json={"optionId": "allow_once"})
        assert unknown.status == 404
        assert (await receipt(client, run_id))["status"] == "awaiting_permission"  # still pending
        answer = await client.post(f"/v1/runs/{run_id}/permissions/{request_id}", json={"optionId": "allow_once"})
        assert answer.status == 200, await answer.text()
        events = await stream.to_end()
    run = await receipt(client, run_id)
    assert run["status"] == "completed"
    resolved = of_kind(events, "permission.resolved")
    assert [r["payload"] for r in resolved] == [
        {"requestId": request_id, "outcome": "selected", "optionId": "allow_once", "by": "client"}
    ]
    assert completed_text(events) == "permission: allow_once"
    done = of_kind(events, "tool.completed")
    assert len(done) == 1 and done[0]["payload"]["status"] == "completed"
    # answering after the fact: the request is closed
    late = await client.post(f"/v1/runs/{run_id}/permissions/{request_id}", json={"optionId": "allow_once"})
    assert late.status in (404, 409)


async def test_permission_rejected(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("permission"))
    created = await post(client, "write it")
    async with LiveStream(client, created["hostRunId"]) as stream:
        asked = (await stream.until("permission.requested"))["payload"]
        answer = await client.post(
            f"/v1/runs/{created['hostRunId']}/permissions/{asked['requestId']}", json={"optionId": "reject_once"}
        )
        assert answer.status == 200
        events = await stream.to_end()
    assert completed_text(events) == "permission: reject_once"
    assert of_kind(events, "tool.completed")[0]["payload"]["status"] == "failed"


async def test_cancel_while_permission_pending(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("permission"))
    created = await post(client, "write it")
    run_id = created["hostRunId"]
    async with LiveStream(client, run_id) as stream:
        asked = (await stream.until("permission.requested"))["payload"]
        process = binding_of(client, "s1").process
        response = await client.post(f"/v1/runs/{run_id}/cancel", json={})
        assert response.status in (200, 202)
        events = await stream.to_end()
    run = await receipt(client, run_id)
    assert run["status"] == "cancelled"
    resolved = of_kind(events, "permission.resolved")
    assert len(resolved) == 1, [e["kind"] for e in events]
    assert resolved[0]["payload"]["requestId"] == asked["requestId"]
    assert resolved[0]["payload"]["outcome"] == "cancelled" and resolved[0]["payload"]["optionId"] is None
    # the agent got the cancelled outcome (its reply says so) and the binding survives
    assert "permission: cancelled" in live_text(events)
    assert not process.closed
    after = await post(client, "write again")
    async with LiveStream(client, after["hostRunId"]) as stream:
        asked = (await stream.until("permission.requested"))["payload"]
        answer = await client.post(
            f"/v1/runs/{after['hostRunId']}/permissions/{asked['requestId']}", json={"optionId": "allow_once"}
        )
        assert answer.status == 200
        events = await stream.to_end()
    after = await receipt(client, after["hostRunId"])
    assert after["status"] == "completed"
    assert_mode(after, events, "native_live")
    assert after["providerRunId"] == run["providerRunId"]
    assert completed_text(events) == "permission: allow_once"


async def test_permission_timeout_answers_cancelled(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("permission", permission_timeout=0.3))
    run, events = await turn(client, "write it")
    asked = of_kind(events, "permission.requested")
    assert len(asked) == 1 and asked[0]["payload"]["timeoutSeconds"] == 0.3
    resolved = of_kind(events, "permission.resolved")
    assert [r["payload"]["outcome"] for r in resolved] == ["cancelled"]
    assert resolved[0]["payload"]["by"] == "timeout"
    assert completed_text(events) == "permission: cancelled"
    assert of_kind(events, "tool.completed")[0]["payload"]["status"] == "failed"
    assert run["status"] == "completed"  # the agent ended its turn normally


async def test_auto_allow_kinds_need_no_request(make_gateway: MakeGateway) -> None:
    client = await gateway_with(make_gateway, FakeAcpPlugin("permission", auto_allow_kinds=("edit",)))
    run, events = await turn(client, "write it")
    assert run["status"] == "completed"
    assert not of_kind(events, "permission.requested")
    resolved = of_kind(events, "permission.resolved")
    assert len(resolved) == 1
    assert resolved[0]["payload"]["by"] == "policy" and resolved[0]["payload"]["optionId"] == "allow_once"
    assert completed_text(events) == "permission: allow_once"


# -- a load or a live session that fails falls back on the same turn --------------------------------------

# reason → (fake behaviour, spec options, wipe the agent's state across the restart)
LOAD_FAILURES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "error": ("replay", {}, True),  # session/load answers -32002 for a session the agent lost
    "exited": ("exit_on_load", {}, False),
    "timeout": ("hang_on_load", {"session_timeout": 2.0}, False),
    "no_replay": ("silent_load", {}, False),
}


def started_pids(path: Path) -> list[int]:
    """The pids of the fake agent processes started so far (``FAKE_ACP_STARTED``)."""
    if not path.exists():
        return []
    return [json.loads(line)["pid"] for line in path.read_text().splitlines() if line.strip()]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def stored_agent_session(client: TestClient, run: dict[str, Any]) -> Any:
    """The agent session id the gateway keeps for the run's session (what a restart would load)."""
    storage = gateway_of(client).storage
    session = await asyncio.to_thread(storage.get_session, run["actorId"], run["sessionId"]) or {}
    return ((session.get("runtimes") or {}).get(AGENT) or {}).get("agentSessionId")


@pytest.mark.parametrize("reason", sorted(LOAD_FAILURES))
async def test_failed_load_falls_back_on_the_same_turn_and_is_never_retried(
    make_gateway: MakeGateway, tmp_path: Path, reason: str
) -> None:
    behaviour, options, wipe = LOAD_FAILURES[reason]
    state = tmp_path / "agent-state"
    starts = tmp_path / "started.jsonl"

    def plugin() -> FakeAcpPlugin:
        made = FakeAcpPlugin(behaviour, state_dir=state, **options)
        made.env["FAKE_ACP_STARTED"] = str(starts)
        return made

    client = await gateway_with(make_gateway, plugin())
    first, _ = await turn(client, "remember the blue door")
    assert first["status"] == "completed" and first["sessionMode"] == "new_session"
    client = await restart(make_gateway, client, plugin(), wipe=state if wipe else None)
    before = len(started_pids(starts))

    run, events = await turn(client, "which door?")
    assert run["status"] == "completed", run["error"]
    info = assert_mode(run, events, "cold_resumed")
    assert info["fallback"]["reason"] == reason, info
    assert info["fallback"]["message"]
    assert info["loadAttempted"] is True and info["previousAgentSessionId"] == first["providerRunId"]
    assert run["providerRunId"] == info["agentSessionId"] != first["providerRunId"]
    assert not [e for e in events if e["source"] == "adapter_replay"]
    reply = completed_text(events)
    assert reply.startswith("echo: " + PACKET_HEADER) and "User: remember the blue door" in reply, reply
    # The failed agent session id is forgotten: the gateway keeps the new one.
    assert await stored_agent_session(client, run) == run["providerRunId"]
    # A process that died or hung in the load is closed; the turn ran on a new one.
    binding = binding_of(client, "s1")
    assert binding.alive
    new_pids = started_pids(starts)[before:]
    assert binding.process.pid in new_pids
    assert len(new_pids) == (2 if reason in ("exited", "timeout") else 1), new_pids
    assert all(not process_alive(pid) for pid in new_pids if pid != binding.process.pid)

    # The next turn uses the new agent session live: the failed load is not tried again.
    again, events = await turn(client, "and now?")
    assert again["status"] == "completed"
    assert_mode(again, events, "native_live")
    assert again["providerRunId"] == run["providerRunId"]
    assert len(started_pids(starts)) == before + len(new_pids)


async def test_refusal_on_a_live_session_retries_the_turn_once_on_a_new_session(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    starts = tmp_path / "started.jsonl"
    plugin = FakeAcpPlugin("silent_load")
    plugin.env["FAKE_ACP_STARTED"] = str(starts)
    client = await gateway_with(make_gateway, plugin)
    first, _ = await turn(client, "remember the blue door")
    # The agent answers, then loses the session while the binding stays live (Hermes after its
    # session store went away answers `refusal` for it).
    forgetting, _ = await turn(client, "forget me")
    assert forgetting["sessionMode"] == "native_live" and forgetting["status"] == "completed"
    old_pid = binding_of(client, "s1").process.pid

    run, events = await turn(client, "which door?")
    assert run["status"] == "completed", run["error"]
    assert run["sessionMode"] == "cold_resumed"  # the receipt says how the turn really ran
    modes = [e["payload"] for e in of_kind(events, "session.info.updated") if "sessionMode" in e["payload"]]
    assert [m["sessionMode"] for m in modes] == ["native_live", "cold_resumed"], modes
    info = modes[1]
    assert info["fallback"]["reason"] == "refusal" and first["providerRunId"] in info["fallback"]["message"]
    assert info["previousAgentSessionId"] == first["providerRunId"] and info["loadAttempted"] is False
    assert run["providerRunId"] == info["agentSessionId"] != first["providerRunId"]
    reply = completed_text(events)
    assert reply.startswith("echo: " + PACKET_HEADER) and "User: remember the blue door" in reply, reply
    assert sum(e["kind"] in TERMINAL_KINDS for e in events) == 1
    assert await stored_agent_session(client, run) == run["providerRunId"]
    # The refused binding is gone with its process; the new session is live from now on.
    binding = binding_of(client, "s1")
    assert binding.process.pid != old_pid and not process_alive(old_pid)
    assert started_pids(starts) == [old_pid, binding.process.pid]
    again, events = await turn(client, "and now?")
    assert_mode(again, events, "native_live")
    assert again["providerRunId"] == run["providerRunId"]


async def test_refusal_on_a_new_session_is_not_retried(make_gateway: MakeGateway) -> None:
    """A refusal on a session the agent has just opened is its answer, not a lost session."""
    client = await gateway_with(make_gateway, FakeAcpPlugin("silent_load"))
    run, events = await turn(client, "refuse this")
    assert run["status"] == "failed" and "refusal" in (run["error"] or ""), run
    assert_mode(run, events, "new_session")
    assert runtime_of(client).live_bindings() == 1
    again, events = await turn(client, "hello")
    assert again["status"] == "completed"
    assert_mode(again, events, "native_live")
    assert again["providerRunId"] == run["providerRunId"]
