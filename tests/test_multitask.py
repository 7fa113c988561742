"""Double-texting: what a new run does while a run of its session is still active
(`multitaskStrategy` on `POST /v1/runs`, `[gateway] multitask_strategy[_by_agent]`, the
`X-Agent-Gateway-Multitask` header of the OpenAI-compatible and AG-UI endpoints).

- `enqueue` (the default): the new run queues behind the active one, as before;
- `reject`: 409 `session_busy` and no run; a repeated requestId is still answered;
- `interrupt`: the active run (and those queued behind it) end `cancelled`, reason
  `interrupted by <new run>`, keeping what they streamed; the new run starts once the agent is
  free, and the agent knows the interrupted turn: chat-only sends it upstream next turn (the fake
  upstream's request log shows it), the fake ACP agent and Hermes keep it in their own session;
- `rollback`: as interrupt, and the agent forgets the turn (chat-only leaves it out of what it sends
  upstream); an agent that keeps its own session refuses it with 400 `rollback_not_supported`.

Real gateways (aiohttp TestServer, SQLite); chat-only talks to the fake upstream, whose
`Reply(hang=True)` streams a first piece and then holds the run; the fake ACP agent's prompt
``hold until cancelled`` holds its turn. No sleeps: every wait is for an event on a stream or a
request at the upstream, bounded by ``WAIT``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._acp import FakeAcpPlugin
from tests._harness import WAIT, MakeGateway, gateway_of, require_mark, run_body, sse_events

ACP = "fake-acp"
HOLD = "hold until cancelled"
FIRST_PIECE = "The first "
HANGING = Reply(text=FIRST_PIECE + "answer goes on and on", chunk_size=len(FIRST_PIECE), hang=True)


class Stream:
    """A run's SSE stream (`data` of each event), read up to an event of a kind, then to its end."""

    def __init__(self, client: TestClient, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.events: list[dict[str, Any]] = []

    async def __aenter__(self) -> Stream:
        self._response = await self.client.get(f"/v1/runs/{self.run_id}/stream")
        assert self._response.status == 200, await self._response.text()
        self._iter: AsyncIterator[dict[str, Any]] = sse_events(self._response).__aiter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._response.close()

    async def until(self, kind: str, timeout: float = WAIT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    event = (await anext(self._iter))["data"]
                except StopAsyncIteration:
                    raise AssertionError(f"ended before {kind}: {kinds(self.events)}") from None
                self.events.append(event)
                if event["kind"] == kind:
                    return event

    async def to_end(self, timeout: float = WAIT) -> list[dict[str, Any]]:
        async with asyncio.timeout(timeout):
            async for item in self._iter:
                self.events.append(item["data"])
        found = kinds(self.events)
        assert found and found[-1] in TERMINAL_KINDS and sum(k in TERMINAL_KINDS for k in found) == 1, found
        return self.events


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


async def events_of(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    async with Stream(client, run_id) as stream:
        return await stream.to_end()


async def post(client: TestClient, body: dict[str, Any], status: int = 201, **headers: str) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=body, headers=headers)
    assert response.status == status, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


async def receipt(client: TestClient, run_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{run_id}")
    assert response.status == 200, await response.text()
    return dict(await response.json())


def chat(request: dict[str, Any]) -> list[tuple[str, str]]:
    """An upstream request's conversation, (role, content), without a system prompt."""
    return [(m["role"], m["content"]) for m in request["messages"] if m["role"] != "system"]


def completed_text(events: list[dict[str, Any]]) -> str:
    texts = [e["payload"]["text"] for e in events if e["kind"] == "message.completed"]
    assert len(texts) == 1, kinds(events)
    return str(texts[0])


async def holding_chat_run(client: TestClient, fake: FakeOpenAI, message: str, session: str) -> tuple[str, Stream]:
    """A chat-only run that streamed its first piece and now hangs; its stream is open."""
    fake.add(HANGING)
    run_id = (await post(client, run_body(message, sessionId=session)))["hostRunId"]
    stream = await Stream(client, run_id).__aenter__()
    await stream.until("message.delta")
    return run_id, stream


# -- chat-only ---------------------------------------------------------------------------------------


async def test_interrupt_cancels_the_answer_keeps_its_text_and_the_next_turn_sends_it(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    session = "s-interrupt"
    first, first_stream = await holding_chat_run(client, fake_llm, "first question", session)
    # A run queued behind it (enqueue) is interrupted too: the new message replaces both.
    queued = (await post(client, run_body("queued question", sessionId=session)))["hostRunId"]
    async with Stream(client, queued) as stream:
        await stream.until("run.queued")

    body = run_body("second question", sessionId=session, multitaskStrategy="interrupt")
    second = (await post(client, body))["hostRunId"]

    events = await first_stream.to_end()
    await first_stream.__aexit__()
    assert events[-1]["kind"] == "run.cancelled"
    assert events[-1]["payload"]["reason"] == f"interrupted by {second}"
    assert events[-1]["payload"]["interruptedBy"] == second
    assert completed_text(events) == FIRST_PIECE  # what it streamed stays its answer
    assert (await receipt(client, first))["status"] == "cancelled"
    queued_events = await events_of(client, queued)
    assert queued_events[-1]["kind"] == "run.cancelled"
    assert queued_events[-1]["payload"]["reason"] == f"interrupted by {second}"

    second_events = await events_of(client, second)
    assert second_events[-1]["kind"] == "run.completed"
    assert completed_text(second_events) == "echo: second question"
    # The upstream was asked twice: the interrupted turn, then the new one carrying it.
    assert len(fake_llm.requests) == 2
    assert chat(fake_llm.requests[1]) == [
        ("user", "first question"),
        ("assistant", FIRST_PIECE),
        ("user", "second question"),
    ]

    # The conversation goes on: the next turn still carries the interrupted one.
    third = (await post(client, run_body("third question", sessionId=session)))["hostRunId"]
    assert (await events_of(client, third))[-1]["kind"] == "run.completed"
    assert chat(fake_llm.requests[2]) == [
        ("user", "first question"),
        ("assistant", FIRST_PIECE),
        ("user", "second question"),
        ("assistant", "echo: second question"),
        ("user", "third question"),
    ]


async def test_rollback_cancels_the_answer_and_the_upstream_never_sees_it_again(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    session = "s-rollback"
    done = (await post(client, run_body("kept question", sessionId=session)))["hostRunId"]
    assert (await events_of(client, done))[-1]["kind"] == "run.completed"
    _, first_stream = await holding_chat_run(client, fake_llm, "regretted question", session)

    second = (await post(client, run_body("instead", sessionId=session, multitaskStrategy="rollback")))["hostRunId"]
    events = await first_stream.to_end()
    await first_stream.__aexit__()
    assert events[-1]["kind"] == "run.cancelled"
    assert events[-1]["payload"]["reason"] == f"rolled back by {second}"
    assert events[-1]["payload"]["rolledBack"] is True
    assert (await events_of(client, second))[-1]["kind"] == "run.completed"
    expected = [("user", "kept question"), ("assistant", "echo: kept question")]
    assert chat(fake_llm.requests[2]) == [*expected, ("user", "instead")]

    after = (await post(client, run_body("and then", sessionId=session)))["hostRunId"]
    assert (await events_of(client, after))[-1]["kind"] == "run.completed"
    assert chat(fake_llm.requests[3]) == [
        *expected,
        ("user", "instead"),
        ("assistant", "echo: instead"),
        ("user", "and then"),
    ]


async def test_reject_is_409_and_creates_nothing_while_the_session_answers(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    session = "s-reject"
    first, first_stream = await holding_chat_run(client, fake_llm, "first", session)

    rejected = run_body("too soon", sessionId=session, multitaskStrategy="reject")
    error = (await post(client, rejected, status=409))["error"]
    assert error["code"] == "session_busy" and error["hostRunId"] == first and error["message"]
    assert [r.host_run_id for r in gateway_of(client).runs.active_runs()] == [first]
    assert len(fake_llm.requests) == 1

    response = await client.post(f"/v1/runs/{first}/cancel", json={})
    assert response.status in (200, 202)
    assert (await first_stream.to_end())[-1]["kind"] == "run.cancelled"
    await first_stream.__aexit__()
    # Once the session is free, the same rejected request is accepted ...
    fake_llm.add(HANGING)
    accepted = (await post(client, rejected))["hostRunId"]
    async with Stream(client, accepted) as stream:
        await stream.until("message.delta")
        # ... and repeating it while that run (of the same session) answers returns it: idempotency first.
        assert (await post(client, rejected, status=200))["hostRunId"] == accepted
        response = await client.post(f"/v1/runs/{accepted}/cancel", json={})
        assert response.status in (200, 202)
        assert (await stream.to_end())[-1]["kind"] == "run.cancelled"


async def test_enqueue_and_plain_cancel_are_unchanged(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> None:
    client = await make_gateway()
    session = "s-enqueue"
    first, first_stream = await holding_chat_run(client, fake_llm, "first", session)
    second = (await post(client, run_body("second", sessionId=session, multitaskStrategy="enqueue")))["hostRunId"]
    async with Stream(client, second) as stream:
        await stream.until("run.queued")
        assert (await receipt(client, second))["status"] == "queued"
        assert (await receipt(client, first))["status"] == "running"
        response = await client.post(f"/v1/runs/{first}/cancel", json={})
        assert response.status in (200, 202)
        events = await stream.to_end()
    first_events = await first_stream.to_end()
    await first_stream.__aexit__()
    assert first_events[-1]["kind"] == "run.cancelled" and "interrupted" not in first_events[-1]["payload"]["reason"]
    assert events[-1]["kind"] == "run.completed"
    # A turn cancelled by its client is not sent upstream again (as before).
    assert chat(fake_llm.requests[1]) == [("user", "second")]


async def test_the_configured_default_per_agent_and_the_request_overrides_it(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway(
        overrides={
            "gateway": {"multitask_strategy": "interrupt", "multitask_strategy_by_agent": {"chat-only": "reject"}}
        }
    )
    session = "s-default"
    first, first_stream = await holding_chat_run(client, fake_llm, "first", session)
    error = (await post(client, run_body("no strategy", sessionId=session), status=409))["error"]
    assert error["code"] == "session_busy"
    second = (await post(client, run_body("queue me", sessionId=session, multitaskStrategy="enqueue")))["hostRunId"]
    async with Stream(client, second) as stream:
        await stream.until("run.queued")
    response = await client.post(f"/v1/runs/{first}/cancel", json={})
    assert response.status in (200, 202)
    await first_stream.to_end()
    await first_stream.__aexit__()
    assert (await events_of(client, second))[-1]["kind"] == "run.completed"


async def test_an_unknown_strategy_is_400(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    error = (await post(client, run_body(multitaskStrategy="later"), status=400))["error"]
    assert error["code"] == "invalid_request" and "multitaskStrategy" in error["message"]
    assert gateway_of(client).runs.active_runs() == []


async def test_the_openai_and_ag_ui_endpoints_take_the_strategy(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway()
    session = "s-endpoints"
    first, first_stream = await holding_chat_run(client, fake_llm, "first", session)
    chat_body = {"model": "chat-only", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Agent-Gateway-Session": session, "X-Agent-Gateway-Multitask": "reject"}
    response = await client.post("/v1/chat/completions", json=chat_body, headers=headers)
    assert response.status == 409, await response.text()
    error = (await response.json())["error"]  # the OpenAI error shape
    assert error["code"] == "session_busy" and error["type"] == "invalid_request_error" and error["message"]
    metadata = {"session_id": session, "multitask_strategy": "reject"}
    response = await client.post("/v1/responses", json={"model": "chat-only", "input": "hi", "metadata": metadata})
    assert response.status == 409 and (await response.json())["error"]["code"] == "session_busy"
    response = await client.post(
        "/v1/chat/completions", json=chat_body, headers={**headers, "X-Agent-Gateway-Multitask": "sometime"}
    )
    assert response.status == 400 and "multitaskStrategy" in (await response.json())["error"]["message"]

    agui = {
        "threadId": session,
        "runId": "agui-" + uuid.uuid4().hex[:8],
        "messages": [{"id": "u1", "role": "user", "content": "hi"}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {"agentGateway": {"workspaceId": "local:test", "multitaskStrategy": "reject"}},
    }
    response = await client.post("/v1/ag-ui/chat-only", json=agui)
    assert response.status == 409 and (await response.json())["error"]["code"] == "session_busy"
    agui["forwardedProps"] = {"agentGateway": {"workspaceId": "local:test"}}
    response = await client.post("/v1/ag-ui/chat-only", json=agui, headers={"X-Agent-Gateway-Multitask": "reject"})
    assert response.status == 409 and (await response.json())["error"]["code"] == "session_busy"
    assert [r.host_run_id for r in gateway_of(client).runs.active_runs()] == [first]

    # Interrupt from the OpenAI endpoint: the held run ends, the completion answers.
    headers["X-Agent-Gateway-Multitask"] = "interrupt"
    response = await client.post("/v1/chat/completions", json=chat_body, headers=headers)
    assert response.status == 200, await response.text()
    assert (await response.json())["choices"][0]["message"]["content"] == "echo: hi"
    events = await first_stream.to_end()
    await first_stream.__aexit__()
    assert events[-1]["payload"]["reason"].startswith("interrupted by run_")
    assert chat(fake_llm.requests[-1]) == [("user", "first"), ("assistant", FIRST_PIECE), ("user", "hi")]


# -- the fake ACP agent (keeps its own session) ----------------------------------------------------------


async def test_acp_interrupt_keeps_the_turn_in_the_agents_session_and_rollback_is_refused(
    make_gateway: MakeGateway,
) -> None:
    client = await make_gateway(extra_plugins=(FakeAcpPlugin("basic"),))
    agents = {a["agentId"]: a for a in (await (await client.get("/v1/agents")).json())["agents"]}
    assert agents[ACP]["policy"]["canRollback"] is False
    assert agents["chat-only"]["policy"]["canRollback"] is True
    session = "s-acp"

    def body(message: str, **fields: Any) -> dict[str, Any]:
        return run_body(message, agentId=ACP, sessionId=session, **fields)

    hello = (await post(client, body("hello")))["hostRunId"]
    assert (await events_of(client, hello))[-1]["kind"] == "run.completed"
    # Its stream has ended; the run leaves the active set once its end is stored.
    await gateway_of(client).runs.wait(hello)
    held = (await post(client, body(HOLD)))["hostRunId"]
    async with Stream(client, held) as held_stream:
        await held_stream.until("thought.delta")

        error = (await post(client, body("forget it", multitaskStrategy="rollback"), status=400))["error"]
        assert error["code"] == "rollback_not_supported" and error["agentId"] == ACP
        assert "canRollback" in error["message"]
        # Rolling back the ACP turn from a chat-only run is refused too: that agent cannot forget it.
        other = run_body("forget it", sessionId=session, multitaskStrategy="rollback")
        assert (await post(client, other, status=400))["error"]["code"] == "rollback_not_supported"
        assert [r.host_run_id for r in gateway_of(client).runs.active_runs()] == [held]

        new = (await post(client, body("history?", multitaskStrategy="interrupt")))["hostRunId"]
        events = await held_stream.to_end()
    assert events[-1]["kind"] == "run.cancelled"
    assert events[-1]["payload"]["reason"] == f"interrupted by {new}"
    new_events = await events_of(client, new)
    assert new_events[-1]["kind"] == "run.completed"
    modes = [e["payload"]["sessionMode"] for e in new_events if e["kind"] == "session.info.updated"]
    assert modes == ["native_live"]
    # The agent's own session holds the interrupted prompt (its answer lists the session's prompts).
    assert completed_text(new_events) == f"hello|{HOLD}"


# -- real Hermes (keeps its own session), on the fake upstream ---------------------------------------


def hermes_binary() -> str:
    require_mark("peers", "the real Hermes")
    peers = Path(os.environ.get("AGENT_GATEWAY_PEERS_DIR") or Path.home() / ".cache" / "agent-gateway" / "peers")
    path = os.environ.get("HERMES_ACP_BIN") or str(peers / "bin" / "hermes-acp")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.skip(f"no Hermes binary at {path} (install it with contrib/peers/install.sh)")
    return path


@pytest.mark.peers
async def test_hermes_interrupt_mid_stream_then_continue_knows_the_interrupted_turn(
    tmp_path: Path, fake_llm: FakeOpenAI, make_gateway: MakeGateway
) -> None:
    hermes_binary()
    from tests._real_agents import LONG_REPLY, TURN_TIMEOUT, Llm, conversation, overrides

    llm = Llm(fake_llm)
    llm.answers["Write a very long list of words."] = LONG_REPLY
    llm.answers["Stop, a short one."] = Reply(text="Short one.")
    home = tmp_path / "agent-home"
    home.mkdir()
    client = await make_gateway(overrides("hermes", fake_llm.base_url, home))
    session = "s-hermes"

    def body(message: str, **fields: Any) -> dict[str, Any]:
        return run_body(message, agentId="hermes", sessionId=session, **fields)

    first = (await post(client, body("Write a very long list of words.")))["hostRunId"]
    async with Stream(client, first) as stream:
        await stream.until("message.delta", TURN_TIMEOUT)
        error = (await post(client, body("Stop, a short one.", multitaskStrategy="rollback"), status=400))["error"]
        assert error["code"] == "rollback_not_supported"
        second = (await post(client, body("Stop, a short one.", multitaskStrategy="interrupt")))["hostRunId"]
        events = await stream.to_end(TURN_TIMEOUT)
    assert events[-1]["kind"] == "run.cancelled", kinds(events)
    assert events[-1]["payload"]["reason"] == f"interrupted by {second}"
    partial = "".join(e["payload"].get("text", "") for e in events if e["kind"] == "message.delta")
    assert partial and completed_text(events) == partial  # what it streamed stays its answer

    async with Stream(client, second) as stream:
        second_events = await stream.to_end(TURN_TIMEOUT)
    assert second_events[-1]["kind"] == "run.completed", kinds(second_events)
    assert completed_text(second_events) == "Short one."
    # What Hermes sent its model for the new turn holds the interrupted request.
    (request,) = llm.turn_requests("Stop, a short one.")
    users = [text for role, text in conversation(request) if role == "user"]
    assert any(text.strip().endswith("Write a very long list of words.") for text in users[:-1]), conversation(request)


# -- the pieces -------------------------------------------------------------------------------------


def test_the_packet_keeps_an_interrupted_turn_and_drops_a_rolled_back_or_cancelled_one() -> None:
    from agent_gateway.sessions import cold_resume_packet, prompt_text

    history = [
        {"status": "completed", "user": "one", "assistant": "first answer"},
        {"status": "cancelled", "user": "two", "assistant": "cut", "interruptedBy": "run_b"},
        {"status": "cancelled", "user": "three", "assistant": "gone", "interruptedBy": "run_c", "rolledBack": True},
        {"status": "cancelled", "user": "four", "assistant": "stopped by the client"},
    ]
    packet = cold_resume_packet(history)
    assert [(item["user"], item["assistant"], item.get("interrupted", False)) for item in packet] == [
        ("one", "first answer", False),
        ("two", "cut", True),
    ]

    # What prompt_text reads of a turn: a cold-resumed ACP prompt says the answer was cut off.
    plan = SimpleNamespace(mode="cold_resumed", packet=packet)
    text = prompt_text(SimpleNamespace(plan=plan, context={}, message="next"))
    assert "User: two\nAssistant: cut\n(The user interrupted this answer with the next message.)" in text


def test_the_configured_strategies_are_checked() -> None:
    from agent_gateway.config import Config

    def problems(gateway: dict[str, Any]) -> list[str]:
        return Config.load(None, env={}, overrides={"gateway": gateway}).problems()

    assert problems({"multitask_strategy": "interrupt", "multitask_strategy_by_agent": {"chat-only": "rollback"}}) == []
    (wrong,) = problems({"multitask_strategy": "later"})
    assert "gateway.multitask_strategy" in wrong and "enqueue, reject, interrupt, rollback" in wrong
    (wrong,) = problems({"multitask_strategy_by_agent": {"chat-only": "never"}})
    assert "multitask_strategy_by_agent.chat-only" in wrong


async def test_openapi_documents_the_strategies_on_every_endpoint_that_takes_one(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    spec = await (await client.get("/openapi.json")).json()
    strategies = ["enqueue", "reject", "interrupt", "rollback"]

    def body_schema(path: str) -> dict[str, Any]:
        schema: dict[str, Any] = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        while "$ref" in schema:
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        return schema

    # POST /v1/runs: the body's field, its values, what each does, and the configured default
    field = body_schema("/v1/runs")["properties"]["multitaskStrategy"]
    assert field["enum"] == strategies
    for words in ("409", "session_busy", "rollback_not_supported", "multitask_strategy_by_agent"):
        assert words in field["description"], words
    assert "409" in spec["paths"]["/v1/runs"]["post"]["responses"]
    # the OpenAI-compatible endpoints: the header (with its values) or metadata.multitask_strategy
    for path in ("/v1/chat/completions", "/v1/responses"):
        operation = spec["paths"][path]["post"]
        [header] = [p for p in operation["parameters"] if p["name"] == "X-Agent-Gateway-Multitask"]
        assert header["in"] == "header" and header["schema"]["enum"] == strategies
        assert "metadata.multitask_strategy" in header["description"]
    # AG-UI: forwardedProps.agentGateway.multitaskStrategy, and the header named in the operation
    operation = spec["paths"]["/v1/ag-ui/{agentId}"]["post"]

    def resolved(schema: dict[str, Any]) -> dict[str, Any]:
        for _ in range(10):  # (bounded: a chain of references)
            if "$ref" not in schema:
                break
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        return schema

    forwarded = body_schema("/v1/ag-ui/{agentId}")["properties"]["forwardedProps"]
    when_object = resolved(forwarded["then"])  # when forwardedProps is an object
    gateway_props = resolved(when_object["properties"]["agentGateway"])
    strategy = gateway_props["properties"]["multitaskStrategy"]
    choices = [alternative.get("enum") for alternative in strategy.get("anyOf", [strategy])]
    assert strategies in choices, strategy  # (or null: not chosen)
    assert "X-Agent-Gateway-Multitask" in operation["description"]
