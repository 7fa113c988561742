"""Only agents that can run are offered, and a run for one that cannot is refused before it exists.

An agent whose command is not found is left out of ``/v1/models`` (read with the official ``openai``
SDK), and ``POST /v1/runs``, chat completions, responses and AG-UI answer 503 ``agent_unavailable``
with the descriptor's reason (what to install or set), each in its protocol's error shape, without
creating a run or a session. Every built-in runtime's reason names what to install.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway import TurnOutcome, hookimpl
from agent_gateway.runtime import RuntimePolicy, Turn
from tests._harness import FAKE_ACP_AGENT, WAIT, MakeGateway, gateway_of, run_body, run_to_end

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "tok-availability"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MISSING = "no-such-binary-xyz"


@pytest.fixture
async def gateway(make_gateway: MakeGateway) -> TestClient:
    return await make_gateway(overrides={"reasonix": {"command": [MISSING, "acp"]}}, tokens={TOKEN: "alice"})


async def descriptor(client: TestClient, agent_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/agents/{agent_id}", headers=AUTH)
    assert response.status == 200, await response.text()
    found: dict[str, Any] = await response.json()
    return found


def sdk_for(client: TestClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=TOKEN, max_retries=0, timeout=WAIT)


async def session_runs(client: TestClient, session_id: str) -> list[dict[str, Any]] | None:
    """The runs of a session, or None when the session does not exist."""
    response = await client.get(f"/v1/sessions/{session_id}", headers=AUTH)
    if response.status == 404:
        return None
    assert response.status == 200, await response.text()
    runs: list[dict[str, Any]] = (await response.json())["runs"]
    return runs


async def test_the_reason_says_what_to_install_or_set(gateway: TestClient) -> None:
    availability = (await descriptor(gateway, "reasonix"))["availability"]
    assert availability["available"] is False and availability["binaryFound"] is False
    reason = availability["reason"]
    assert reason.startswith(f"{MISSING} not found on the agent's PATH (")
    assert "npm install -g reasonix" in reason and "[reasonix] command" in reason
    assert (await descriptor(gateway, "chat-only"))["availability"]["available"] is True


async def test_models_leave_out_an_unavailable_agent(gateway: TestClient) -> None:
    async with sdk_for(gateway) as sdk:
        models = [model.id async for model in sdk.models.list()]
        assert "chat-only" in models and "reasonix" not in models
        with pytest.raises(openai.InternalServerError) as caught:
            await sdk.models.retrieve("reasonix")
    assert caught.value.status_code == 503 and caught.value.code == "agent_unavailable"


async def test_a_run_for_an_unavailable_agent_is_refused_before_it_exists(gateway: TestClient) -> None:
    reason = (await descriptor(gateway, "reasonix"))["availability"]["reason"]
    session = "s-" + uuid.uuid4().hex[:8]
    # The session already has a run: the refused one must not join it.
    await run_to_end(gateway, run_body("first", sessionId=session), headers=AUTH)
    response = await gateway.post("/v1/runs", json=run_body("hi", agentId="reasonix", sessionId=session), headers=AUTH)
    assert response.status == 503, await response.text()
    assert response.headers["x-should-retry"] == "false"
    error = (await response.json())["error"]
    assert error["code"] == "agent_unavailable"
    assert (error["agentId"], error["reason"]) == ("reasonix", reason)
    assert reason in error["message"]
    runs = await session_runs(gateway, session)
    assert runs is not None and [r["receipt"]["agentId"] for r in runs] == ["chat-only"]
    # A session the refused run would have started is not created either.
    fresh = "s-" + uuid.uuid4().hex[:8]
    response = await gateway.post("/v1/runs", json=run_body("hi", agentId="reasonix", sessionId=fresh), headers=AUTH)
    assert response.status == 503
    assert await session_runs(gateway, fresh) is None


async def test_openai_endpoints_answer_agent_unavailable_in_their_shape(gateway: TestClient) -> None:
    reason = (await descriptor(gateway, "reasonix"))["availability"]["reason"]
    session = "s-" + uuid.uuid4().hex[:8]
    async with sdk_for(gateway) as sdk:
        with pytest.raises(openai.InternalServerError) as chat:
            await sdk.chat.completions.create(
                model="reasonix", messages=[{"role": "user", "content": "hi"}], metadata={"session_id": session}
            )
        with pytest.raises(openai.InternalServerError) as streamed:
            await sdk.chat.completions.create(
                model="reasonix", messages=[{"role": "user", "content": "hi"}], stream=True, user=session
            )
        with pytest.raises(openai.InternalServerError) as response:
            await sdk.responses.create(model="reasonix", input="hi", metadata={"session_id": session})
    for caught in (chat, streamed, response):
        error = caught.value
        assert error.status_code == 503 and error.code == "agent_unavailable" and error.param == "model"
        assert error.type == "server_error" and reason in error.message
        assert error.response.headers["x-should-retry"] == "false"  # the SDK does not retry it
    assert await session_runs(gateway, session) is None


async def test_ag_ui_answers_agent_unavailable(gateway: TestClient) -> None:
    pytest.importorskip("ag_ui")
    thread = "t-" + uuid.uuid4().hex[:8]
    body = {
        "threadId": thread,
        "runId": "r-1",
        "messages": [{"id": "m1", "role": "user", "content": "hi"}],
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    response = await gateway.post("/v1/ag-ui/reasonix", json=body, headers=AUTH)
    assert response.status == 503, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == "agent_unavailable" and "npm install -g reasonix" in error["reason"]
    assert await session_runs(gateway, thread) is None


async def test_every_built_in_runtime_says_what_to_install(make_gateway: MakeGateway) -> None:
    client = await make_gateway(
        overrides={
            "hermes": {"command": ["no-such-hermes-xyz"]},
            "pi_lab": {"command": ["no-such-pi-xyz"]},
            "acp_agents": {"mine__command": ["no-such-agent-xyz", "acp"]},  # [acp_agents.mine] command
        },
        tokens={TOKEN: "alice"},
    )
    reasons = {agent: (await descriptor(client, agent))["availability"] for agent in ("hermes", "pi-lab", "mine")}
    assert all(a["available"] is False for a in reasons.values()), reasons
    assert "no-such-hermes-xyz not found on the agent's PATH" in reasons["hermes"]["reason"]
    assert "pip install 'hermes-agent[acp,mcp]'" in reasons["hermes"]["reason"]
    assert "[hermes] command" in reasons["hermes"]["reason"]
    assert "no-such-pi-xyz not found on the agent's PATH" in reasons["pi-lab"]["reason"]
    assert "npm install -g @earendil-works/pi-coding-agent" in reasons["pi-lab"]["reason"]
    assert "[pi_lab] command" in reasons["pi-lab"]["reason"]
    assert "no-such-agent-xyz not found on the agent's PATH" in reasons["mine"]["reason"]
    assert "[acp_agents.mine] command" in reasons["mine"]["reason"]
    async with sdk_for(client) as sdk:
        models = {model.id async for model in sdk.models.list()}
    assert not models & {"hermes", "pi-lab", "mine"}
    response = await client.post("/v1/runs", json=run_body("hi", agentId="pi-lab"), headers=AUTH)
    assert response.status == 503 and (await response.json())["error"]["code"] == "agent_unavailable"


async def test_an_agent_installed_later_is_offered_once_the_descriptors_are_read(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    """Availability is believed for a while on run creation; GET /v1/agents refreshes it at once."""
    program = tmp_path / "late-agent"
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    client = await make_gateway(
        overrides={
            "acp_agents": {
                "late__command": [str(program)],
                "late__env": env,
                # the launcher's agent script, which nothing in its command names
                "late__sandbox_read_only": [str(Path(FAKE_ACP_AGENT).parent)],
            }
        },
        tokens={TOKEN: "alice"},
    )
    gateway_of(client).runs.availability.ttl = 3600.0  # nothing but a descriptor read refreshes it
    response = await client.post("/v1/runs", json=run_body("hi", agentId="late"), headers=AUTH)
    assert response.status == 503
    assert "is not an executable file" in (await response.json())["error"]["reason"]
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_ACP_AGENT}" --behaviour basic "$@"\n')
    program.chmod(0o755)
    # Still believed unavailable: run creation did not look again...
    response = await client.post("/v1/runs", json=run_body("hi", agentId="late"), headers=AUTH)
    assert response.status == 503
    # ...until the descriptors were read.
    assert (await descriptor(client, "late"))["availability"]["available"] is True
    _receipt, events = await run_to_end(client, run_body("hello", agentId="late"), headers=AUTH)
    assert events[-1]["event"] == "run.completed"


class CountingRuntime:
    """Counts describe() calls: run creation must not look the agent up on every POST."""

    agent_id = "counting"
    display_name = "Counting"
    provider = "tests"

    def __init__(self) -> None:
        self.policy = RuntimePolicy(context_carrier="none")
        self.described = 0

    def describe(self) -> dict[str, Any]:
        self.described += 1
        return {"capabilities": ["chat"], "availability": {"available": True}}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        await turn.emit("message.completed", {"text": "ok"})
        return TurnOutcome("completed")

    async def close(self) -> None:
        pass


class CountingPlugin:
    def __init__(self) -> None:
        self.runtime = CountingRuntime()

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(self.runtime)


async def test_run_creation_does_not_describe_the_agent_per_request(make_gateway: MakeGateway) -> None:
    plugin = CountingPlugin()
    client = await make_gateway(extra_plugins=(plugin,), tokens={TOKEN: "alice"})
    gateway_of(client).runs.availability.ttl = 3600.0
    session = "s-" + uuid.uuid4().hex[:8]
    await run_to_end(client, run_body("turn 0", agentId="counting", sessionId=session), headers=AUTH)
    after_first = plugin.runtime.described  # the descriptor registry's and the availability's
    for index in range(1, 6):
        await run_to_end(client, run_body(f"turn {index}", agentId="counting", sessionId=session), headers=AUTH)
    assert plugin.runtime.described == after_first
