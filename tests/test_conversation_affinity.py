"""Conversation affinity (docs/sessions.md): stateless clients that resend the whole history and
no session hint keep their conversation.

Real clients drive it (the ``openai`` SDK, LangChain's ``ChatOpenAI``, pydantic-ai's
``message_history``, the OpenAI Agents SDK's ``to_input_list``, raw AG-UI inputs; the Node clients
are in tests/test_node_clients.py), three turns each, each client's usage non-zero, against
chat-only on the fake upstream (continuity read from the upstream's request log: each turn's
request holds the history once) and the fake ACP agent (a stateful agent: it stays
``native_live`` and its ``history?`` answer lists the prompts it was sent itself).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway
from tests._openai import ACP_AGENT, FakeAcpPlugin

ALICE, BOB = "tok-affinity-alice", "tok-affinity-bob"
AGENTS = ("chat-only", ACP_AGENT)
SESSION = "X-Agent-Gateway-Session"
AFFINITY = "X-Agent-Gateway-Session-Affinity"
Messages = list[dict[str, Any]]


@pytest.fixture
async def gateway(make_gateway: MakeGateway) -> TestClient:
    return await make_gateway(tokens={ALICE: "alice", BOB: "bob"}, extra_plugins=(FakeAcpPlugin(),))


def sdk_for(client: TestClient, token: str = ALICE) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=token, max_retries=0, timeout=WAIT)


@pytest.fixture
async def sdk(gateway: TestClient) -> AsyncIterator[openai.AsyncOpenAI]:
    client = sdk_for(gateway)
    try:
        yield client
    finally:
        await client.close()


async def chat(sdk: openai.AsyncOpenAI, agent: str, messages: Messages, *, stream: bool = False) -> dict[str, Any]:
    """One chat completion with no session hint: its answer, session header, affinity, extension."""
    raw = await sdk.chat.completions.with_raw_response.create(model=agent, messages=messages, stream=stream)  # type: ignore[call-overload]
    if stream:
        chunks = [chunk async for chunk in raw.parse()]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        extension = next(c.model_extra["agent_gateway"] for c in chunks if (c.model_extra or {}).get("agent_gateway"))
    else:
        completion = raw.parse()
        text = completion.choices[0].message.content or ""
        extension = completion.model_extra["agent_gateway"]
    return {"text": text, "session": raw.headers[SESSION], "affinity": raw.headers[AFFINITY], **extension}


def upstream_turns(fake_llm: FakeOpenAI, index: int = -1) -> list[tuple[str, str]]:
    """(role, content) of what chat-only sent the upstream in request ``index`` (its own
    configured system prompt left out)."""
    return [(m["role"], m["content"]) for m in fake_llm.requests[index]["messages"] if m["role"] != "system"]


async def session_detail(client: TestClient, session_id: str, token: str = ALICE) -> tuple[int, dict[str, Any]]:
    response = await client.get(f"/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {token}"})
    return response.status, (await response.json() if response.status == 200 else {})


# -- the openai SDK ------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
async def test_openai_sdk_three_turns_resending_history_keep_one_session(
    sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI, agent: str
) -> None:
    last = "history?" if agent == ACP_AGENT else "third question"
    history: Messages = [{"role": "system", "content": "Be brief."}]
    turns = []
    for number, question in enumerate(("first question", "second question", last)):
        history.append({"role": "user", "content": question})
        turn = await chat(sdk, agent, history, stream=number == 1)
        history.append({"role": "assistant", "content": turn["text"]})
        turns.append(turn)
    assert [t["affinity"] for t in turns] == ["fresh", "continued", "continued"]
    assert len({t["session"] for t in turns}) == 1
    assert {t["sessionId"] for t in turns} == {turns[0]["session"]}  # the body's extension says the same
    if agent == ACP_AGENT:
        # The agent's own live session: it was sent each prompt once and remembers them itself.
        assert [t["sessionMode"] for t in turns[1:]] == ["native_live", "native_live"]
        assert turns[2]["text"] == "first question|second question"
    else:
        # Each upstream request holds the conversation once: the gateway's, not the client's copy
        # appended to it.
        assert upstream_turns(fake_llm) == [
            ("user", "first question"),
            ("assistant", "echo: first question"),
            ("user", "second question"),
            ("assistant", "echo: second question"),
            ("user", "third question"),
        ]


async def test_responses_three_turns_resending_input_keep_one_session(
    sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI
) -> None:
    items: list[dict[str, Any]] = []
    sessions, affinities = [], []
    for question in ("first question", "second question", "third question"):
        items.append({"role": "user", "content": [{"type": "input_text", "text": question}]})
        raw = await sdk.responses.with_raw_response.create(model="chat-only", input=items)  # type: ignore[arg-type]
        response = raw.parse()
        assert response.metadata == {"session_id": raw.headers[SESSION]}
        sessions.append(raw.headers[SESSION])
        affinities.append(raw.headers[AFFINITY])
        items.append(
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": response.output_text}]}
        )
    assert affinities == ["fresh", "continued", "continued"]
    assert len(set(sessions)) == 1
    assert [content for _role, content in upstream_turns(fake_llm)] == [
        "first question",
        "echo: first question",
        "second question",
        "echo: second question",
        "third question",
    ]


# -- LangChain ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
async def test_langchain_chat_openai_three_turns_keep_one_session(
    gateway: TestClient, fake_llm: FakeOpenAI, agent: str
) -> None:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(
        model=agent,
        base_url=str(gateway.make_url("/v1")),
        api_key=ALICE,  # type: ignore[arg-type]
        max_retries=0,
        timeout=WAIT,
        include_response_headers=True,
    )
    last = "history?" if agent == ACP_AGENT else "third question"
    history: list[BaseMessage] = [SystemMessage("You are terse.")]
    sessions = []
    answer = None
    for question in ("first question", "second question", last):
        history.append(HumanMessage(question))
        answer = await model.ainvoke(history)
        assert isinstance(answer, AIMessage)
        sessions.append(answer.response_metadata["headers"][SESSION.lower()])
        if agent == "chat-only":  # the upstream's usage, as LangChain shows it
            usage = answer.usage_metadata
            assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        history.append(answer)
    assert len(set(sessions)) == 1
    assert answer is not None
    if agent == ACP_AGENT:
        assert answer.content == "first question|second question"
    else:
        assert [content for _role, content in upstream_turns(fake_llm)] == [
            "first question",
            "echo: first question",
            "second question",
            "echo: second question",
            "third question",
        ]


THREE_TURNS_UPSTREAM = [
    "first question",
    "echo: first question",
    "second question",
    "echo: second question",
    "third question",
]


async def session_list(client: TestClient, token: str = ALICE) -> list[dict[str, Any]]:
    response = await client.get("/v1/sessions", headers={"Authorization": f"Bearer {token}"})
    assert response.status == 200, await response.text()
    sessions: list[dict[str, Any]] = (await response.json())["sessions"]
    return sessions


# -- pydantic-ai ----------------------------------------------------------------------------------------


async def test_pydantic_ai_message_history_three_turns_keep_one_session(
    gateway: TestClient, fake_llm: FakeOpenAI
) -> None:
    """pydantic-ai resends ``message_history`` (the previous run's ``all_messages()``); turn 2
    streams (``run_stream``). Each run's usage is the upstream's."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=str(gateway.make_url("/v1")), api_key=ALICE)
    agent = Agent(OpenAIChatModel("chat-only", provider=provider), instructions="Be brief.")
    history: list[ModelMessage] = []
    for number, question in enumerate(("first question", "second question", "third question")):
        if number == 1:
            async with agent.run_stream(question, message_history=history) as streamed:
                text = await streamed.get_output()
            usage, history = streamed.usage, streamed.all_messages()
        else:
            result = await agent.run(question, message_history=history)
            text, usage, history = result.output, result.usage, result.all_messages()
        assert text == f"echo: {question}"
        assert usage.input_tokens > 0 and usage.output_tokens > 0, usage
    assert [content for _role, content in upstream_turns(fake_llm)] == THREE_TURNS_UPSTREAM
    assert [(s["agentId"], s["runCount"]) for s in await session_list(gateway)] == [("chat-only", 3)]


# -- the OpenAI Agents SDK ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_agents_sdk_to_input_list_three_turns_keep_one_session(
    gateway: TestClient, fake_llm: FakeOpenAI, api: str
) -> None:
    """The Agents SDK resends ``result.to_input_list()`` plus the next question; turn 2 streams
    (``run_streamed``). Each run's usage is the upstream's (a streamed chat completion reports it
    when asked: ``include_usage``, which the SDK sets by itself only for OpenAI's own URL)."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key=ALICE, max_retries=0, timeout=WAIT)
    model: Any = (
        OpenAIChatCompletionsModel(model="chat-only", openai_client=client)
        if api == "chat_completions"
        else OpenAIResponsesModel(model="chat-only", openai_client=client)
    )
    settings = ModelSettings(include_usage=True)
    agent = Agent(name="assistant", instructions="Be brief.", model=model, model_settings=settings)
    items: list[Any] = []
    try:
        for number, question in enumerate(("first question", "second question", "third question")):
            items.append({"role": "user", "content": question})
            if number == 1:
                streamed = Runner.run_streamed(agent, items)
                async for _event in streamed.stream_events():
                    pass
                result: Any = streamed
            else:
                result = await Runner.run(agent, items)
            assert result.final_output == f"echo: {question}"
            usage = result.context_wrapper.usage
            assert usage.input_tokens > 0 and usage.output_tokens > 0, usage
            assert usage.total_tokens == usage.input_tokens + usage.output_tokens
            items = result.to_input_list()
    finally:
        await client.close()
    assert [content for _role, content in upstream_turns(fake_llm)] == THREE_TURNS_UPSTREAM
    assert [(s["agentId"], s["runCount"]) for s in await session_list(gateway)] == [("chat-only", 3)]


# -- item references ------------------------------------------------------------------------------------


async def test_responses_item_references_to_earlier_answers_keep_one_session(
    gateway: TestClient, sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI
) -> None:
    """A client that lets the server store its items (the Vercel AI SDK's OpenAI provider) resends
    earlier answers as ``item_reference``s only: the gateway resolves its own answers."""
    items: list[dict[str, Any]] = []
    sessions, affinities = [], []
    for question in ("first question", "second question", "third question"):
        items.append({"role": "user", "content": [{"type": "input_text", "text": question}]})
        raw = await sdk.responses.with_raw_response.create(model="chat-only", input=items)  # type: ignore[arg-type]
        sessions.append(raw.headers[SESSION])
        affinities.append(raw.headers[AFFINITY])
        items.append({"type": "item_reference", "id": raw.parse().output[0].id})
    assert affinities == ["fresh", "continued", "continued"]
    assert len(set(sessions)) == 1
    assert [content for _role, content in upstream_turns(fake_llm)] == THREE_TURNS_UPSTREAM
    # Another actor's references resolve to nothing of theirs: a new session, never Alice's.
    bob = sdk_for(gateway, BOB)
    try:
        raw = await bob.responses.with_raw_response.create(model="chat-only", input=items[:3])  # type: ignore[arg-type]
    finally:
        await bob.close()
    assert raw.headers[AFFINITY] == "new" and raw.headers[SESSION] != sessions[0]


# -- branches, concurrency, actors ---------------------------------------------------------------------


async def test_an_edited_earlier_message_starts_a_branch_that_gets_the_history(
    gateway: TestClient, sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI
) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    second = await chat(sdk, "chat-only", history)
    assert second["session"] == first["session"]

    # The user edits the first question and asks again: the original session is not appended to.
    edited = [
        {"role": "user", "content": "first question, edited"},
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": second["text"]},
        {"role": "user", "content": "third question"},
    ]
    branch = await chat(sdk, "chat-only", edited)
    assert branch["affinity"] == "new"
    assert branch["session"] != first["session"]
    # The branch's agent got the edited history, once.
    assert [content for _role, content in upstream_turns(fake_llm)] == [
        "first question, edited",
        "echo: first question",
        "second question",
        "echo: second question",
        "third question",
    ]
    status, original = await session_detail(gateway, first["session"])
    assert status == 200 and original["session"]["runCount"] == 2

    # The branch is a conversation of its own from now on.
    edited += [{"role": "assistant", "content": branch["text"]}, {"role": "user", "content": "fourth question"}]
    after = await chat(sdk, "chat-only", edited)
    assert (after["affinity"], after["session"]) == ("continued", branch["session"])
    assert [content for _role, content in upstream_turns(fake_llm)][-3:] == [
        "third question",
        "echo: third question",
        "fourth question",
    ]


async def test_two_requests_with_one_history_at_once_never_share_a_session(
    make_gateway: MakeGateway, storage_kind: str
) -> None:
    """Of two requests resending the same history together (a regenerate, a double submit), one
    continues the session and the other starts a branch holding that history (SQLite and
    PostgreSQL)."""
    gateway = await make_gateway(tokens={ALICE: "alice"}, extra_plugins=(FakeAcpPlugin(),), storage=storage_kind)
    sdk = sdk_for(gateway)
    try:
        await _two_at_once(gateway, sdk)
    finally:
        await sdk.close()


async def _two_at_once(gateway: TestClient, sdk: openai.AsyncOpenAI) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, ACP_AGENT, history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "history?"}]
    one, two = await asyncio.gather(chat(sdk, ACP_AGENT, history), chat(sdk, ACP_AGENT, history))
    assert sorted([one["affinity"], two["affinity"]]) == ["continued", "new"]
    continued, branch = (one, two) if one["affinity"] == "continued" else (two, one)
    assert continued["session"] == first["session"] != branch["session"]
    assert continued["text"] == "first question"  # the live agent session: prompts it was sent
    assert branch["sessionMode"] == "cold_resumed"  # a new agent session given the history
    status, original = await session_detail(gateway, first["session"])
    assert status == 200 and original["session"]["runCount"] == 2

    # Sent again once both ended (a regenerate after the fact): that history is no session's
    # last turn any more, so it is a branch again.
    again = await chat(sdk, ACP_AGENT, history)
    assert again["affinity"] == "new" and again["session"] not in (first["session"], branch["session"])


async def test_another_actor_with_the_same_history_gets_its_own_session(
    gateway: TestClient, sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI
) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    bob = sdk_for(gateway, BOB)
    try:
        theirs = await chat(bob, "chat-only", history)
    finally:
        await bob.close()
    assert theirs["affinity"] == "new" and theirs["session"] != first["session"]
    assert (await session_detail(gateway, first["session"], BOB))[0] == 404
    status, original = await session_detail(gateway, first["session"])
    assert status == 200 and original["session"]["runCount"] == 1
    # Alice's own next turn still continues her session.
    mine = await chat(sdk, "chat-only", history)
    assert (mine["affinity"], mine["session"]) == ("continued", first["session"])


async def test_the_history_is_compared_by_its_text_not_its_layout(sdk: openai.AsyncOpenAI) -> None:
    """Content parts, white space and the tool messages in between do not make another conversation."""
    first = await chat(sdk, "chat-only", [{"role": "user", "content": "first   question"}])
    history: Messages = [
        {"role": "user", "content": [{"type": "text", "text": "first question\n"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "tool output"},
        {"role": "assistant", "content": [{"type": "text", "text": "  " + first["text"]}]},
        {"role": "user", "content": "second question"},
    ]
    second = await chat(sdk, "chat-only", history)
    assert (second["affinity"], second["session"]) == ("continued", first["session"])


async def test_a_retry_with_the_idempotency_key_is_the_same_run(sdk: openai.AsyncOpenAI) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    key = {"Idempotency-Key": "turn-2-" + uuid.uuid4().hex}
    sent = await sdk.chat.completions.with_raw_response.create(model="chat-only", messages=history, extra_headers=key)  # type: ignore[arg-type]
    again = await sdk.chat.completions.with_raw_response.create(model="chat-only", messages=history, extra_headers=key)  # type: ignore[arg-type]
    assert sent.parse().id == again.parse().id
    assert sent.headers[SESSION] == again.headers[SESSION] == first["session"]
    # The same for a first question (a new session): the retry is the same run.
    fresh = {"Idempotency-Key": "turn-1-" + uuid.uuid4().hex}
    question: Messages = [{"role": "user", "content": "a new conversation"}]
    sent = await sdk.chat.completions.with_raw_response.create(
        model="chat-only", messages=question, extra_headers=fresh
    )  # type: ignore[arg-type]
    again = await sdk.chat.completions.with_raw_response.create(
        model="chat-only", messages=question, extra_headers=fresh
    )  # type: ignore[arg-type]
    assert sent.parse().id == again.parse().id and sent.headers[SESSION] == again.headers[SESSION]
    # Without the key, the same history is another request: a branch.
    other = await chat(sdk, "chat-only", history)
    assert other["affinity"] == "new"


async def test_a_session_hint_wins_over_the_history(sdk: openai.AsyncOpenAI) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    raw = await sdk.chat.completions.with_raw_response.create(
        model="chat-only",
        messages=history,
        extra_headers={SESSION: "pinned-by-client"},  # type: ignore[arg-type]
    )
    assert (raw.headers[SESSION], raw.headers[AFFINITY]) == ("pinned-by-client", "pinned")
    # The pinned session's run made the conversation its head: resending it continues there.
    history += [{"role": "assistant", "content": raw.parse().choices[0].message.content}]
    history.append({"role": "user", "content": "third question"})
    third = await chat(sdk, "chat-only", history)
    assert (third["affinity"], third["session"]) == ("continued", "pinned-by-client")


async def test_a_failed_turn_leaves_the_session_to_continue(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    fake_llm.add(Reply(status=500, error_message="upstream down"))
    with pytest.raises(openai.APIStatusError) as failed:
        await chat(sdk, "chat-only", history)
    assert failed.value.response.headers[SESSION] == first["session"]
    retry = await chat(sdk, "chat-only", history)  # the client retries the same request
    assert (retry["affinity"], retry["session"]) == ("continued", first["session"])


async def test_a_refused_request_leaves_the_session_to_continue(sdk: openai.AsyncOpenAI) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    with pytest.raises(openai.BadRequestError):  # refused by the core: no run
        await sdk.chat.completions.create(
            model="chat-only",
            messages=history,
            extra_headers={"X-Agent-Gateway-Multitask": "no-such-strategy"},  # type: ignore[arg-type]
        )
    second = await chat(sdk, "chat-only", history)
    assert (second["affinity"], second["session"]) == ("continued", first["session"])


async def test_a_deleted_session_is_not_continued(make_gateway: MakeGateway, storage_kind: str) -> None:
    gateway = await make_gateway(tokens={ALICE: "alice"}, storage=storage_kind)
    sdk = sdk_for(gateway)
    try:
        await _deleted(gateway, sdk)
    finally:
        await sdk.close()


async def _deleted(gateway: TestClient, sdk: openai.AsyncOpenAI) -> None:
    history: Messages = [{"role": "user", "content": "first question"}]
    first = await chat(sdk, "chat-only", history)
    deleted = await gateway.delete(f"/v1/sessions/{first['session']}", headers={"Authorization": f"Bearer {ALICE}"})
    assert deleted.status == 200
    history += [{"role": "assistant", "content": first["text"]}, {"role": "user", "content": "second question"}]
    second = await chat(sdk, "chat-only", history)
    assert second["affinity"] == "new" and second["session"] != first["session"]


# -- AG-UI ----------------------------------------------------------------------------------------------


def sse_events(body: bytes) -> list[dict[str, Any]]:
    events = []
    for block in body.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


async def ag_ui_turn(client: TestClient, agent: str, thread_id: str, messages: Messages) -> dict[str, Any]:
    body = {"threadId": thread_id, "runId": uuid.uuid4().hex, "messages": messages, "state": {}, "tools": []}
    body.update(context=[], forwardedProps={})
    response = await client.post(f"/v1/ag-ui/{agent}", json=body, headers={"Authorization": f"Bearer {ALICE}"})
    assert response.status == 200, await response.text()
    events = sse_events(await response.read())
    started = events[0]
    assert started["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED", events
    modes = [
        e["snapshot"]["sessionMode"]
        for e in events
        if e["type"] == "STATE_SNAPSHOT" and "sessionMode" in e.get("snapshot", {})
    ]
    return {
        "text": "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"),
        "threadId": started["threadId"],
        "sessionId": started["metadata"]["agentGateway"]["sessionId"],
        "header": response.headers[SESSION],
        "affinity": response.headers[AFFINITY],
        "modes": modes,
    }


@pytest.mark.parametrize("agent", AGENTS)
async def test_ag_ui_inputs_on_new_threads_resending_messages_keep_one_session(
    gateway: TestClient, fake_llm: FakeOpenAI, agent: str
) -> None:
    """A client that makes a new thread per run but sends the whole conversation: the history
    finds the session; each run still answers with the thread it was sent."""
    last = "history?" if agent == ACP_AGENT else "third question"
    messages: Messages = []
    turns = []
    for number, question in enumerate(("first question", "second question", last)):
        messages.append({"id": f"u{number}", "role": "user", "content": question})
        thread = f"thread-{uuid.uuid4().hex}"
        turn = await ag_ui_turn(gateway, agent, thread, messages)
        assert turn["threadId"] == thread
        messages.append({"id": f"a{number}", "role": "assistant", "content": turn["text"]})
        turns.append(turn)
    assert [t["affinity"] for t in turns] == ["pinned", "continued", "continued"]
    first_thread = turns[0]["threadId"]
    assert {t["sessionId"] for t in turns} == {t["header"] for t in turns} == {first_thread}
    if agent == ACP_AGENT:
        assert turns[2]["modes"] == ["native_live"]
        assert turns[2]["text"] == "first question|second question"
    else:
        assert [content for _role, content in upstream_turns(fake_llm)] == [
            "first question",
            "echo: first question",
            "second question",
            "echo: second question",
            "third question",
        ]


async def test_ag_ui_new_thread_with_an_unknown_history_gets_it(gateway: TestClient, fake_llm: FakeOpenAI) -> None:
    messages: Messages = [
        {"id": "u0", "role": "user", "content": "a question asked elsewhere"},
        {"id": "a0", "role": "assistant", "content": "an answer given elsewhere"},
        {"id": "u1", "role": "user", "content": "and now?"},
    ]
    turn = await ag_ui_turn(gateway, "chat-only", "imported-thread", messages)
    assert (turn["affinity"], turn["sessionId"], turn["threadId"]) == ("new", "imported-thread", "imported-thread")
    assert [content for _role, content in upstream_turns(fake_llm)] == [
        "a question asked elsewhere",
        "an answer given elsewhere",
        "and now?",
    ]
    # The thread is known from now on: its id wins, whatever the messages say.
    again = await ag_ui_turn(gateway, "chat-only", "imported-thread", [{"id": "x", "role": "user", "content": "hi"}])
    assert (again["affinity"], again["sessionId"]) == ("pinned", "imported-thread")
