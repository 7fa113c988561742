"""The real Reasonix and Hermes binaries behind the real gateway HTTP API, on a fake LLM.

Each test runs for both agents (parametrized). The agents are the ones `contrib/peers/install.sh`
installs (`REASONIX_BIN` / `HERMES_ACP_BIN`, else `${AGENT_GATEWAY_PEERS_DIR}/bin/<name>`); they
talk to the contrib fake OpenAI server on 127.0.0.1, and every test gives its agent a state
directory of its own (Reasonix: `HOME`; Hermes: `HERMES_HOME` and `HOME`). A missing binary is a
failure, not a skip: CI installs them.

What is checked, per agent:
- two turns in one gateway session (the second only "可以") share one agent session
  (`native_live`, same `providerRunId`), and the LLM request of turn 2 carries turn 1;
- after a gateway restart on the same data dir the agent session is `loaded`, and the replayed
  history never shows up as new output;
- cancel mid-stream ends the run `cancelled` and keeps the live binding;
- an agent process killed mid-turn fails the run with the signal, and the next turn recovers;
- Hermes whose session store was wiped across a restart: the load falls back to a new agent
  session with the cold-resume packet on the same turn, and the next turn is live on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpRuntime
from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import MakeGateway, gateway_of, sse_events
from tests._real_agents import (
    LONG_REPLY,
    TURN_TIMEOUT,
    Llm,
    conversation,
    last_user_text,
    overrides,
)

pytestmark = pytest.mark.peers

AGENTS = ("reasonix", "hermes")


@pytest.fixture(params=AGENTS)
def agent(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def llm(fake_llm: FakeOpenAI) -> Llm:
    return Llm(fake_llm)


@pytest.fixture
def agent_state(tmp_path: Path) -> Path:
    """The agent's own state directory (its HOME), kept across gateway restarts within a test."""
    path = tmp_path / "agent-home"
    path.mkdir()
    return path


class Session:
    """One gateway session with one agent, through the HTTP API."""

    def __init__(self, client: TestClient, agent: str) -> None:
        self.client = client
        self.agent = agent
        self.session_id = "s-" + uuid.uuid4().hex[:10]

    def body(self, message: str) -> dict[str, Any]:
        return {
            "requestId": "req-" + uuid.uuid4().hex[:10],
            "agentId": self.agent,
            "sessionId": self.session_id,
            "workspaceId": "local:test",
            "message": message,
        }

    async def start(self, message: str) -> str:
        response = await self.client.post("/v1/runs", json=self.body(message))
        assert response.status == 201, await response.text()
        return str((await response.json())["hostRunId"])

    async def stream(
        self, run_id: str, on_event: Callable[[dict[str, Any]], Any] | None = None
    ) -> list[dict[str, Any]]:
        """The run's events (SSE `data`) until its terminal event; `on_event` sees each one."""
        events: list[dict[str, Any]] = []
        async with asyncio.timeout(TURN_TIMEOUT):
            async with self.client.get(f"/v1/runs/{run_id}/stream") as response:
                assert response.status == 200, await response.text()
                async for sse in sse_events(response):
                    event = sse["data"]
                    events.append(event)
                    if on_event is not None:
                        result = on_event(event)
                        if asyncio.iscoroutine(result):
                            await result
        assert events and events[-1]["kind"] in TERMINAL_KINDS, [e["kind"] for e in events]
        assert sum(e["kind"] in TERMINAL_KINDS for e in events) == 1
        return events

    async def receipt(self, run_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/runs/{run_id}")
        assert response.status == 200, await response.text()
        return dict(await response.json())

    async def turn(self, message: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        run_id = await self.start(message)
        events = await self.stream(run_id)
        return await self.receipt(run_id), events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


def completed_text(events: list[dict[str, Any]]) -> str:
    texts = [e["payload"].get("text", "") for e in events if e["kind"] == "message.completed"]
    assert len(texts) == 1, kinds(events)
    return str(texts[0])


def delta_text(events: list[dict[str, Any]]) -> str:
    return "".join(str(e["payload"].get("text", "")) for e in events if e["kind"] == "message.delta")


def assert_completed(receipt: dict[str, Any], events: list[dict[str, Any]]) -> None:
    assert receipt["status"] == "completed", (receipt.get("error"), kinds(events))
    assert events[-1]["kind"] == "run.completed"


def runtime_of(client: TestClient, agent: str) -> AcpRuntime:
    runtime = gateway_of(client).runtimes[agent]
    assert isinstance(runtime, AcpRuntime)
    return runtime


def agent_pid(client: TestClient, agent: str, session_id: str) -> int:
    """The pid of the agent process bound to this gateway session (the runtime's live binding)."""
    runtime = runtime_of(client, agent)
    bindings = [b for key, b in runtime._bindings.items() if key[1] == session_id]
    assert len(bindings) == 1, runtime._bindings
    pid = bindings[0].process.pid
    assert pid is not None
    return pid


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(child) for child in text)
    return found


def is_wrapper(pid: int) -> bool:
    """A process between the gateway and the agent: the sandbox (`bwrap`, its PID-namespace init,
    the in-sandbox supervisor) or an npm launcher (`node`)."""
    exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    supervisor = any(arg.endswith(b"sandbox/supervisor.py") for arg in argv[:4])
    return exe == "bwrap" or exe.startswith("node") or supervisor


def agent_process(pid: int) -> int:
    """The process doing the agent's work under the one the gateway started: the sandbox's
    processes, then `bin/reasonix`, an npm launcher (`node`, spawnSync of the Go binary); Hermes'
    entry point is the agent itself."""
    for _ in range(8):  # bwrap, its init, the supervisor, the launcher: bounded
        if not is_wrapper(pid):
            break
        (pid,) = children(pid)
    return pid


# -- tests -----------------------------------------------------------------------------------------


async def test_second_turn_reuses_the_live_agent_session(
    agent: str, llm: Llm, agent_state: Path, make_gateway: MakeGateway
) -> None:
    llm.answers["我想给笔记加一个总结，可以吗？"] = Reply(text="当然可以：我会先列出要点，再写总结。")
    llm.answers["可以"] = Reply(text="好的，这是总结。")
    client = await make_gateway(overrides(agent, llm.fake.base_url, agent_state))
    session = Session(client, agent)

    first, events1 = await session.turn("我想给笔记加一个总结，可以吗？")
    assert_completed(first, events1)
    assert first["sessionMode"] == "new_session"
    assert completed_text(events1) == "当然可以：我会先列出要点，再写总结。"

    second, events2 = await session.turn("可以")
    assert_completed(second, events2)
    assert second["sessionMode"] == "native_live"
    assert second["providerRunId"] == first["providerRunId"] and first["providerRunId"]
    assert completed_text(events2) == "好的，这是总结。"
    assert "context.warning" not in kinds(events2)

    # The agent's own LLM request for turn 2 carries turn 1.
    requests = llm.turn_requests("可以")
    assert len(requests) == 1, [last_user_text(r)[-40:] for r in llm.fake.requests]
    messages = conversation(requests[0])
    assert any(role == "user" and "我想给笔记加一个总结，可以吗？" in text for role, text in messages), messages
    assert ("assistant", "当然可以：我会先列出要点，再写总结。") in [(r, t.strip()) for r, t in messages], messages
    assert messages[-1][0] == "user" and messages[-1][1].strip().endswith("可以")


async def test_restart_loads_the_agent_session_and_replay_is_not_new_output(
    agent: str, llm: Llm, agent_state: Path, make_gateway: MakeGateway, tmp_path: Path
) -> None:
    turn1 = ("Please remember the code word PELICAN for later.", "Understood, I will remember PELICAN.")
    turn2 = ("可以", "Good, PELICAN is noted for the summary.")
    turn3 = ("What was the code word again?", "You asked me to keep a seabird in mind.")
    for message, reply in (turn1, turn2, turn3):
        llm.answers[message] = Reply(text=reply)
    config = overrides(agent, llm.fake.base_url, agent_state)
    data_dir = tmp_path / "gateway-data"
    client = await make_gateway(config, data_dir=data_dir)
    session = Session(client, agent)
    first, events1 = await session.turn(turn1[0])
    second, events2 = await session.turn(turn2[0])
    assert_completed(first, events1)
    assert_completed(second, events2)
    assert second["sessionMode"] == "native_live"
    bindings = list(runtime_of(client, agent)._bindings.values())
    assert len(bindings) == 1
    old_process = bindings[0].process

    await client.close()  # the old gateway stops: its agent process must end with it
    assert old_process.closed and old_process.returncode is not None

    client = await make_gateway(config, data_dir=data_dir)
    session = Session(client, agent)
    session.session_id = second["sessionId"]
    third, events3 = await session.turn(turn3[0])
    assert_completed(third, events3)
    assert third["sessionMode"] == "loaded", third
    assert third["providerRunId"] == first["providerRunId"]
    new_bindings = list(runtime_of(client, agent)._bindings.values())
    assert len(new_bindings) == 1 and new_bindings[0].process.pid != old_process.pid

    # Nothing from the replay is new output: the run's text is the new reply only ...
    assert completed_text(events3) == turn3[1]
    assert delta_text(events3) == turn3[1]
    old_texts = [turn1[0], turn1[1], turn2[1]]
    for event in events3:
        if event["source"] == "adapter_replay":
            continue
        blob = json.dumps(event["payload"], ensure_ascii=False)
        assert not any(text in blob for text in old_texts), event
    # ... and what the agent replayed is journalled as adapter_replay only, already known here.
    replayed = [e for e in events3 if e["source"] == "adapter_replay"]
    assert {e["kind"] for e in replayed} == {"session.replayed"}, replayed
    summary = replayed[0]["payload"]
    assert summary["deduplicated"] == 4 and summary["journalled"] == 0, summary
    mode_events = [e for e in events3 if e["kind"] == "session.info.updated" and "sessionMode" in e["payload"]]
    assert mode_events[0]["payload"]["replay"] == summary

    # The loaded agent session still knows turns 1 and 2: its LLM request for turn 3 carries them.
    requests = llm.turn_requests(turn3[0])
    assert len(requests) == 1
    messages = [(role, text.strip()) for role, text in conversation(requests[0])]
    for role, text in (("user", turn1[0]), ("assistant", turn1[1]), ("user", turn2[0]), ("assistant", turn2[1])):
        assert (role, text) in messages, (role, text, messages)


async def test_cancel_mid_stream_keeps_the_live_binding(
    agent: str, llm: Llm, agent_state: Path, make_gateway: MakeGateway
) -> None:
    llm.answers["Write a very long list of words."] = LONG_REPLY
    llm.answers["可以"] = Reply(text="OK, a shorter one then.")
    client = await make_gateway(overrides(agent, llm.fake.base_url, agent_state))
    session = Session(client, agent)

    run_id = await session.start("Write a very long list of words.")
    cancelled_at: list[float] = []

    async def cancel_on_first_delta(event: dict[str, Any]) -> None:
        if event["kind"] == "message.delta" and not cancelled_at:
            cancelled_at.append(asyncio.get_running_loop().time())
            response = await client.post(f"/v1/runs/{run_id}/cancel", json={})
            assert response.status in (200, 202), await response.text()

    events = await session.stream(run_id, cancel_on_first_delta)
    ended_at = asyncio.get_running_loop().time()
    first = await session.receipt(run_id)
    assert cancelled_at, kinds(events)
    assert events[-1]["kind"] == "run.cancelled", (first.get("error"), kinds(events))
    assert first["status"] == "cancelled"
    # The agent stopped when asked (well before the reply's ~20 s), not by being killed.
    assert ended_at - cancelled_at[0] < 10.0
    assert len(delta_text(events)) < len(LONG_REPLY.text)
    assert runtime_of(client, agent).live_bindings() == 1

    second, events2 = await session.turn("可以")
    assert_completed(second, events2)
    assert second["sessionMode"] == "native_live"
    assert second["providerRunId"] == first["providerRunId"] and first["providerRunId"]
    assert completed_text(events2) == "OK, a shorter one then."


async def test_agent_killed_mid_turn_fails_the_run_and_the_next_turn_recovers(
    agent: str, llm: Llm, agent_state: Path, make_gateway: MakeGateway
) -> None:
    llm.answers["Please remember the code word PELICAN for later."] = Reply(text="Understood, PELICAN.")
    llm.answers["Write a very long list of words."] = LONG_REPLY
    llm.answers["Are you still there?"] = Reply(text="Yes, still here.")
    client = await make_gateway(overrides(agent, llm.fake.base_url, agent_state))
    session = Session(client, agent)
    first, events1 = await session.turn("Please remember the code word PELICAN for later.")
    assert_completed(first, events1)

    launcher = agent_pid(client, agent, session.session_id)
    run_id = await session.start("Write a very long list of words.")
    killed: list[int] = []

    def kill_on_first_delta(event: dict[str, Any]) -> None:
        if event["kind"] == "message.delta" and not killed:
            pid = agent_process(agent_pid(client, agent, session.session_id))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    events = await session.stream(run_id, kill_on_first_delta)
    second = await session.receipt(run_id)
    assert killed, kinds(events)
    assert events[-1]["kind"] == "run.failed", kinds(events)
    assert second["status"] == "failed"
    terminal = events[-1]["payload"]
    if agent == "reasonix":
        # The npm launcher outlives the Go agent and reports its death by signal as exit code 1.
        assert terminal["exitCode"] == 1, terminal
        assert terminal["reason"].startswith("the agent process exited with code 1"), terminal
    else:
        # Confined or not, a death by signal reads the same (bubblewrap's 128 + N is turned back).
        assert terminal["exitCode"] == -signal.SIGKILL, terminal
        expected = "the agent process exited with code -9 (killed by signal SIGKILL)"
        assert terminal["reason"].startswith(expected), terminal

    third, events3 = await session.turn("Are you still there?")
    assert_completed(third, events3)
    assert completed_text(events3) == "Yes, still here."
    assert delta_text(events3) == "Yes, still here."
    assert agent_pid(client, agent, session.session_id) != launcher  # a new agent process
    # The new process loads the agent session the killed one had saved.
    assert third["sessionMode"] == "loaded", third
    assert third["providerRunId"] == first["providerRunId"]


def wipe_hermes_sessions(hermes_home: Path) -> list[str]:
    """Remove Hermes' session store (`$HERMES_HOME/state.db` with its SQLite journal files, and
    `sessions/` transcripts), as if it had lost it; the names of what was removed."""
    removed = []
    for path in [*sorted(hermes_home.glob("state.db*")), hermes_home / "sessions"]:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(path.name)
    return removed


async def test_hermes_with_its_session_store_wiped_falls_back_and_the_turn_succeeds(
    llm: Llm, agent_state: Path, make_gateway: MakeGateway, tmp_path: Path
) -> None:
    agent = "hermes"
    turn1 = ("Please remember the code word HERON for later.", "Noted: HERON.")
    turn2 = ("What was the code word again?", "It was HERON.")
    turn3 = ("Thanks, that is all.", "You are welcome.")
    for message, reply in (turn1, turn2, turn3):
        llm.answers[message] = Reply(text=reply)
    config = overrides(agent, llm.fake.base_url, agent_state)
    data_dir = tmp_path / "gateway-data"
    client = await make_gateway(config, data_dir=data_dir)
    session = Session(client, agent)
    first, events1 = await session.turn(turn1[0])
    assert_completed(first, events1)
    await client.close()  # Hermes stops with the gateway ...
    # ... and loses its sessions (in the HERMES_HOME of the actor, `local` without tokens).
    assert "state.db" in wipe_hermes_sessions(agent_state / "hermes" / "local")

    client = await make_gateway(config, data_dir=data_dir)
    session = Session(client, agent)
    session.session_id = first["sessionId"]
    second, events2 = await session.turn(turn2[0])
    assert_completed(second, events2)
    assert second["sessionMode"] == "cold_resumed", second
    modes = [e["payload"] for e in events2 if e["kind"] == "session.info.updated" and "sessionMode" in e["payload"]]
    assert [m["sessionMode"] for m in modes] == ["cold_resumed"], modes
    info = modes[0]
    # Hermes answers session/load of a session it no longer has with null and no replay.
    assert info["fallback"]["reason"] == "no_replay", info
    assert info["loadAttempted"] is True and info["previousAgentSessionId"] == first["providerRunId"]
    assert second["providerRunId"] == info["agentSessionId"] != first["providerRunId"]
    assert completed_text(events2) == turn2[1]
    # The new agent session got turn 1 from the gateway's cold-resume packet.
    (request,) = llm.turn_requests(turn2[0])
    assert any(role == "user" and turn1[0] in text for role, text in conversation(request)), conversation(request)

    # The failed load is not tried again: the next turn is live on the new agent session.
    third, events3 = await session.turn(turn3[0])
    assert_completed(third, events3)
    assert third["sessionMode"] == "native_live"
    assert third["providerRunId"] == second["providerRunId"]
