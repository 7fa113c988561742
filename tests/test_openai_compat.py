"""The OpenAI-compatible plugin, driven by the official ``openai`` SDK (``AsyncOpenAI(base_url=...)``).

Every scenario runs twice: against chat-only on the fake OpenAI upstream, and against a fake ACP
agent (``contrib/fake_acp_agents/agent.py`` as a real subprocess). The plugin is loaded through
its entry point, as every built-in plugin is. The resume after a dropped connection also runs on
the real PostgreSQL (it reads the journal back from storage).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.plugins.openai_compat import chat_api, responses_api
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway, gateway_of
from tests._openai import (
    ACP_AGENT,
    AGENTS,
    TOKEN,
    FakeAcpPlugin,
    sdk_for,
)


@pytest.fixture
async def gateway(make_gateway: MakeGateway) -> TestClient:
    return await make_gateway(tokens={TOKEN: "alice"}, extra_plugins=(FakeAcpPlugin(),))


@pytest.fixture
async def sdk(gateway: TestClient) -> AsyncIterator[openai.AsyncOpenAI]:
    client = await sdk_for(gateway)
    try:
        yield client
    finally:
        await client.close()


def expected_answer(agent: str, text: str) -> str:
    return "echo: " + text  # both the fake upstream and the fake ACP agent echo


# -- models -------------------------------------------------------------------------------------------


async def test_models_lists_every_agent(sdk: openai.AsyncOpenAI) -> None:
    models = [model.id async for model in sdk.models.list()]
    assert set(AGENTS) <= set(models)
    assert (await sdk.models.retrieve("chat-only")).id == "chat-only"
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.models.retrieve("no-such-agent")
    assert caught.value.code == "model_not_found"


# -- chat completions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
async def test_non_streaming_chat(sdk: openai.AsyncOpenAI, agent: str) -> None:
    completion = await sdk.chat.completions.create(model=agent, messages=[{"role": "user", "content": "hello there"}])
    assert completion.object == "chat.completion"
    assert completion.model == agent
    assert completion.choices[0].message.content == expected_answer(agent, "hello there")
    assert completion.choices[0].finish_reason == "stop"
    extension = completion.model_extra["agent_gateway"]  # type: ignore[index]
    assert extension["status"] == "completed"
    assert completion.id == "chatcmpl-" + extension["hostRunId"]


@pytest.mark.parametrize("agent", AGENTS)
async def test_streaming_chat(sdk: openai.AsyncOpenAI, agent: str) -> None:
    stream = await sdk.chat.completions.create(
        model=agent, messages=[{"role": "user", "content": [{"type": "text", "text": "stream me"}]}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_answer(agent, "stream me")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert len({chunk.id for chunk in chunks}) == 1
    # Thoughts are omitted by default (the ACP agent streams one before answering).
    assert not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices)


@pytest.mark.parametrize("agent", AGENTS)
async def test_two_turn_chat_keeps_the_session(
    sdk: openai.AsyncOpenAI, gateway: TestClient, fake_llm: FakeOpenAI, agent: str
) -> None:
    session = {"session_id": f"two-turns-{agent}"}
    first = await sdk.chat.completions.create(
        model=agent, messages=[{"role": "user", "content": "first question"}], metadata=session
    )
    history = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "history?" if agent == ACP_AGENT else "second question"},
    ]
    second = await sdk.chat.completions.create(model=agent, messages=history, metadata=session)
    one, two = (c.model_extra["agent_gateway"] for c in (first, second))  # type: ignore[index]
    assert one["sessionId"] == two["sessionId"] == session["session_id"]
    if agent == ACP_AGENT:
        # The agent's own live session: it remembers the first prompt itself.
        assert two["sessionMode"] == "native_live"
        assert "first question" in (second.choices[0].message.content or "")
    else:
        # chat-only keeps the conversation in the gateway session and sends it upstream.
        upstream = fake_llm.requests[-1]["messages"]
        assert [m["content"] for m in upstream if m["role"] == "user"][-2:] == ["first question", "second question"]


async def test_session_from_header_and_user(sdk: openai.AsyncOpenAI) -> None:
    by_header = await sdk.chat.completions.create(
        model="chat-only",
        messages=[{"role": "user", "content": "hi"}],
        user="user-field",
        extra_headers={"X-Agent-Gateway-Session": "from-header"},
    )
    by_user = await sdk.chat.completions.create(
        model="chat-only", messages=[{"role": "user", "content": "hi"}], user="user-field"
    )
    fresh = await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "hi"}])
    sessions = [c.model_extra["agent_gateway"]["sessionId"] for c in (by_header, by_user, fresh)]  # type: ignore[index]
    assert sessions[:2] == ["from-header", "user-field"]
    assert sessions[2] not in sessions[:2]


async def test_reasoning_content_by_config(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> None:
    client = await make_gateway(overrides={"openai_compat": {"reasoning": "reasoning_content"}})
    sdk = await sdk_for(client, token="unused")
    try:
        fake_llm.add(Reply(text="the answer", reasoning="let me think"))
        stream = await sdk.chat.completions.create(
            model="chat-only", messages=[{"role": "user", "content": "q"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
        thoughts = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
        assert thoughts == "let me think"
        fake_llm.add(Reply(text="again", reasoning="more thought"))
        completion = await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "q"}])
        message = completion.choices[0].message
        assert message.content == "again"
        assert message.model_extra["reasoning_content"] == "more thought"  # type: ignore[index]
        fake_llm.add(Reply(text="third", reasoning="step one"))
        events = [e async for e in await sdk.responses.create(model="chat-only", input="q", stream=True)]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "step one"
        output = events[-1].response.output  # type: ignore[union-attr]
        assert [item.type for item in output] == ["reasoning", "message"]
        assert output[0].content[0].text == "step one"  # type: ignore[union-attr, index]
        assert events[-1].response.output_text == "third"  # type: ignore[union-attr]
    finally:
        await sdk.close()


async def test_a_failed_run_is_an_openai_error(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    fake_llm.add(Reply(status=400, error_message="upstream refused"))
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    fake_llm.add(Reply(status=400, error_message="upstream refused"))
    stream = await sdk.chat.completions.create(
        model="chat-only", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


# -- responses ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AGENTS)
async def test_non_streaming_and_streaming_response(sdk: openai.AsyncOpenAI, agent: str) -> None:
    response = await sdk.responses.create(model=agent, input="plain question")
    assert response.status == "completed"
    assert response.output_text == expected_answer(agent, "plain question")
    stream = await sdk.responses.create(
        model=agent, input=[{"role": "user", "content": [{"type": "input_text", "text": "streamed"}]}], stream=True
    )
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected_answer(agent, "streamed")
    assert events[-1].response.output_text == text  # type: ignore[union-attr]
    # Thoughts are omitted by default (the ACP agent thinks before answering).
    assert not any(e.type.startswith("response.reasoning") for e in events)
    assert [item.type for item in events[-1].response.output] == ["message"]  # type: ignore[union-attr]
    again = await sdk.responses.retrieve(events[-1].response.id)  # type: ignore[union-attr]
    assert again.status == "completed" and again.output_text == text


@pytest.mark.parametrize("agent", AGENTS)
async def test_previous_response_id_continues_the_session(sdk: openai.AsyncOpenAI, agent: str) -> None:
    first = await sdk.responses.create(model=agent, input="remember this")
    second = await sdk.responses.create(
        model=agent, input="history?" if agent == ACP_AGENT else "and now", previous_response_id=first.id
    )
    one, two = (r.model_extra["agent_gateway"] for r in (first, second))  # type: ignore[index]
    assert one["sessionId"] == two["sessionId"]
    if agent == ACP_AGENT:
        assert two["sessionMode"] == "native_live"
        assert "remember this" in second.output_text


async def _slow_gateway(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, agent: str, storage: str = "sqlite"
) -> TestClient:
    """A gateway whose agent answers in many small, slowed pieces."""
    if agent == ACP_AGENT:
        plugins = (FakeAcpPlugin("flood", delay=0.01),)
        return await make_gateway(tokens={TOKEN: "alice"}, extra_plugins=plugins, storage=storage)
    fake_llm.default = Reply(text="".join(f"{n}," for n in range(60)), chunk_size=3, delay=0.01)
    return await make_gateway(tokens={TOKEN: "alice"}, storage=storage)


def _slow_input(agent: str) -> str:
    return "flood 60 numbered" if agent == ACP_AGENT else "count"


@pytest.mark.parametrize("agent", AGENTS)
async def test_background_response_resumes_after_a_dropped_connection(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, agent: str, storage_kind: str
) -> None:
    client = await _slow_gateway(make_gateway, fake_llm, agent, storage_kind)
    sdk = await sdk_for(client)
    try:
        stream = await sdk.responses.create(model=agent, input=_slow_input(agent), background=True, stream=True)
        first: list[Any] = []
        async with asyncio.timeout(WAIT):
            async for event in stream:
                first.append(event)
                if event.type == "response.output_text.delta":
                    break  # (an agent's backlog of chunks may arrive as one delta: cut at the first)
        await stream.close()  # the connection drops mid-answer
        response_id = first[0].response.id
        last = first[-1].sequence_number
        resumed = await sdk.responses.retrieve(response_id, stream=True, starting_after=last)
        rest = [event async for event in resumed]
        numbers = [e.sequence_number for e in first + rest]
        assert numbers == list(range(len(numbers))), "a gap or a duplicate at the resume point"
        assert rest[-1].type == "response.completed"
        text = "".join(e.delta for e in first + rest if e.type == "response.output_text.delta")
        assert text == rest[-1].response.output_text
        assert text.startswith("0,1,2,") and text.endswith("59,")
        # A second resume from the middle gives exactly the same events again.
        again = await sdk.responses.retrieve(response_id, stream=True, starting_after=last)
        assert [e.model_dump() for e in [event async for event in again]] == [e.model_dump() for e in rest]
    finally:
        await sdk.close()


@pytest.mark.parametrize("agent", AGENTS)
async def test_cancel_a_background_response(make_gateway: MakeGateway, fake_llm: FakeOpenAI, agent: str) -> None:
    if agent == ACP_AGENT:
        client = await make_gateway(tokens={TOKEN: "alice"}, extra_plugins=(FakeAcpPlugin("flood", delay=0.05),))
        prompt = "flood 100000"
    else:
        fake_llm.default = Reply(text="never", hang=True)
        client = await make_gateway(tokens={TOKEN: "alice"})
        prompt = "hang"
    sdk = await sdk_for(client)
    try:
        stream = await sdk.responses.create(model=agent, input=prompt, background=True, stream=True)
        seen: list[Any] = []
        async with asyncio.timeout(WAIT):
            async for event in stream:  # until the agent is at work, so the cancel stops a live turn
                seen.append(event)
                if event.type == ("response.output_text.delta" if agent == ACP_AGENT else "response.in_progress"):
                    break
            response_id = seen[0].response.id
            assert (await sdk.responses.retrieve(response_id)).status == "in_progress"
            cancelled = await sdk.responses.cancel(response_id)
            assert cancelled.status == "cancelled"
            seen.extend([event async for event in stream])  # the open stream ends with the cancel
        assert seen[-1].type == "response.incomplete"
        assert seen[-1].response.status == "cancelled"  # type: ignore[union-attr]
        assert [e.sequence_number for e in seen] == list(range(len(seen))), [(e.sequence_number, e.type) for e in seen]
        assert (await sdk.responses.retrieve(response_id)).status == "cancelled"
    finally:
        await sdk.close()


@pytest.mark.parametrize("storage", ["sqlite", "postgres"])
async def test_resume_inside_a_compacted_answer_loses_and_repeats_nothing(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, storage: str
) -> None:
    """A client streamed a response live, one number per delta; the run ends and the journal folds
    its deltas into one event ([storage] compaction). Resuming after any number, even one inside
    the folded stretch, gives exactly the rest of the text, under the numbers first given."""
    answer = "".join(f"{n}," for n in range(40))
    fake_llm.add(Reply(text=answer, chunk_size=5))
    client = await make_gateway(tokens={TOKEN: "alice"}, storage=storage)
    sdk = await sdk_for(client)
    try:
        live = [e async for e in await sdk.responses.create(model="chat-only", input="count", stream=True)]
        response = live[-1].response  # type: ignore[union-attr]
        host_run_id = response.id.removeprefix("resp_")
        gateway = gateway_of(client)
        await gateway.journal.flush()  # the stream ends before its terminal event is committed
        before, after = await asyncio.to_thread(gateway.storage.compact_run, host_run_id)
        assert after < before  # the deltas were folded
        deltas = [e for e in live if e.type == "response.output_text.delta"]
        assert len(deltas) == len(answer) // 5
        for cut in (deltas[0], deltas[3], deltas[-2], deltas[-1]):
            n = cut.sequence_number
            rest = [e async for e in await sdk.responses.retrieve(response.id, stream=True, starting_after=n)]
            sent = "".join(e.delta for e in live if e.type == "response.output_text.delta" and e.sequence_number <= n)
            resumed = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
            assert sent + resumed == answer, n
            numbers = [e.sequence_number for e in rest]
            assert numbers == sorted(set(numbers)) and numbers[0] > n
            assert [(e.type, e.sequence_number) for e in rest if e.type != "response.output_text.delta"] == [
                (e.type, e.sequence_number)
                for e in live
                if e.sequence_number > n and e.type != "response.output_text.delta"
            ]
    finally:
        await sdk.close()


def _dechunk(body: bytes) -> bytes:
    out, rest = [], body
    for _ in range(1_000_000):
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return b"".join(out)
        out.append(rest[:size])
        rest = rest[size + 2 :]
    raise AssertionError("too many chunks")


async def test_a_slow_stream_client_is_replayed_never_sent_merged_deltas(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    """A client that does not read while the run streams: its buffer (8 events) overflows, and it
    is moved back to the journal instead of getting merged deltas, so every sequence_number is
    there and the text is whole."""
    # 8 MB: more than the kernel's socket buffers hold, so the gateway's writes back up.
    answer = "".join(f"{n:07d}," for n in range(1_000_000))
    fake_llm.add(Reply(text=answer, chunk_size=8000))
    client = await make_gateway(overrides={"gateway": {"stream_buffer_events": 8}})
    gateway = gateway_of(client)
    ended = asyncio.Event()
    gateway.runs.listeners.append(lambda run: ended.set() if run.is_terminal else None)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for us
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (client.host, client.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps({"model": "chat-only", "input": "count", "stream": True}).encode()
    writer.write(
        b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await writer.drain()
    async with asyncio.timeout(WAIT):
        await ended.wait()  # the whole answer is out while we read nothing
        raw = await reader.read()
    writer.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    frames = [f for f in _dechunk(chunked).decode().split("\n\n") if f.startswith("event:")]
    events = [json.loads(frame.split("\ndata: ", 1)[1]) for frame in frames]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == answer
    assert events[-1]["type"] == "response.completed"
    assert gateway.stream_stats.replays > 0  # the slow path was taken
    assert gateway.stream_stats.merges == 0


# -- auth, errors, hostile input ------------------------------------------------------------------


async def test_a_bad_token_gets_an_openai_401(gateway: TestClient) -> None:
    sdk = await sdk_for(gateway, token="wrong")
    try:
        with pytest.raises(openai.AuthenticationError) as caught:
            await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "x"}])
        assert caught.value.body["type"] == "authentication_error"  # type: ignore[index]
    finally:
        await sdk.close()


async def test_unknown_response_and_model(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.responses.retrieve("resp_nope")
    assert caught.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "model_not_found"
    assert caught.value.body["param"] == "model"  # type: ignore[index]


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


HOSTILE_BODIES: list[tuple[str, Any, str | None]] = [
    ("model is a number", {"model": 7, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ("messages is a string", {"model": "chat-only", "messages": "hi"}, "messages"),
    ("no user message", {"model": "chat-only", "messages": [{"role": "system", "content": "x"}]}, "messages"),
    ("unknown role", {"model": "chat-only", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("content is a number", {"model": "chat-only", "messages": [{"role": "user", "content": 5}]}, None),
    ("blank message", {"model": "chat-only", "messages": [{"role": "user", "content": "  "}]}, None),
    (
        "stream is a string",
        {"model": "chat-only", "messages": [{"role": "user", "content": "x"}], "stream": "yes"},
        "stream",
    ),
    (
        "metadata not strings",
        {"model": "chat-only", "messages": [{"role": "user", "content": "x"}], "metadata": {"a": 1}},
        "metadata",
    ),
    ("deep JSON", {"model": "chat-only", "messages": [{"role": "user", "content": "x"}], "tools": _deep(200)}, None),
    ("NUL in text", {"model": "chat-only", "messages": [{"role": "user", "content": "a\u0000b"}]}, None),
    ("a list body", [1, 2], None),
    # a field deep in the body is named as OpenAI names it
    (
        "a part's text is a number",
        {"model": "chat-only", "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
        "messages[0].content[0].text",
    ),
    (
        "a part without a type",
        {"model": "chat-only", "messages": [{"role": "user", "content": ["hi"]}]},
        "messages[0].content[0]",
    ),
    (
        "an earlier tool call's arguments are an object",
        {
            "model": "chat-only",
            "messages": [
                {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}]},
                {"role": "user", "content": "x"},
            ],
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        "include_usage is a number",
        {"model": "chat-only", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
    ),
]


@pytest.mark.parametrize(("case", "body", "param"), HOSTILE_BODIES, ids=[c[0] for c in HOSTILE_BODIES])
async def test_hostile_chat_bodies_get_openai_400s(
    gateway: TestClient, case: str, body: Any, param: str | None
) -> None:
    response = await gateway.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 400, (case, await response.text())
    error = (await response.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param


async def test_a_blank_last_user_message_is_named_and_ignored_fields_pass(gateway: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    blank = {"model": "chat-only", "messages": [{"role": "user", "content": "q"}, {"role": "user", "content": " "}]}
    response = await gateway.post("/v1/chat/completions", json=blank, headers=auth)
    error = (await response.json())["error"]
    assert (response.status, error["param"]) == (400, "messages[1].content")
    assert error["message"] == "the last user message must hold some text"
    # fields OpenAI clients send and the gateway ignores are accepted; only text parts are the message
    body = {
        "model": "chat-only",
        "temperature": 0.2,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}]}
        ],
    }
    answer = await gateway.post("/v1/chat/completions", json=body, headers=auth)
    assert answer.status == 200, await answer.text()
    assert (await answer.json())["choices"][0]["message"]["content"] == expected_answer("chat-only", "hi")


async def test_the_served_openai_operations_are_the_declarations(gateway: TestClient) -> None:
    spec = await (await gateway.get("/openapi.json")).json()
    declared = [
        *chat_api.DECLARED,
        responses_api.CREATE_RESPONSE,
        responses_api.GET_RESPONSE,
        responses_api.CANCEL_RESPONSE,
    ]
    for route in declared:
        operation, schemas = route.openapi_operation()
        assert spec["paths"][route.openapi_path][route.method.lower()] == operation, route.path
        for name, schema in schemas.items():
            assert spec["components"]["schemas"][name] == schema, name
    # every path the plugin serves is one of those declarations
    served = {path for path in spec["paths"] if path.startswith(("/v1/models", "/v1/chat/", "/v1/responses"))}
    assert served == {route.openapi_path for route in declared}
    # the streamed chunk is documented, and an error body on every status but 200
    responses = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "text/event-stream" in responses["200"]["content"]
    for status, response in responses.items():
        if status != "200":
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/OpenAIError"}


async def test_hostile_raw_bodies_get_openai_4xx(gateway: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    cases = [
        (b"{not json", 400),
        (b'{"model": "chat-only", "input": "\\ud800"}', 400),  # a lone surrogate
        (b"[" * 100_000 + b"]" * 100_000, 400),
        (b'{"model": "chat-only", "input": "' + b"x" * (2 * 1024 * 1024) + b'"}', 413),
    ]
    for raw, status in cases:
        response = await gateway.post("/v1/responses", data=raw, headers=auth)
        assert response.status == status, (raw[:40], await response.text())
        error = (await response.json())["error"]
        assert set(error) == {"message", "type", "param", "code"}
    bad = await gateway.post(
        "/v1/responses", data=b"hello", headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"}
    )
    assert bad.status == 415
    assert set((await bad.json())["error"]) == {"message", "type", "param", "code"}


HOSTILE_RESPONSE_BODIES: list[tuple[str, Any, str, str | None]] = [
    ("a list body", [1, 2], "invalid_request", None),
    ("model is a number", {"model": 7, "input": "x"}, "invalid_request", "model"),
    ("empty input", {"model": "chat-only", "input": []}, "invalid_request", "input"),
    ("an item is a string", {"model": "chat-only", "input": ["x"]}, "invalid_request", "input[0]"),
    (
        "content is a number",
        {"model": "chat-only", "input": [{"role": "user", "content": 5}]},
        "invalid_request",
        "input[0].content",
    ),
    (
        "a part's text is a number",
        {"model": "chat-only", "input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "invalid_request",
        "input[0].content[0].text",
    ),
    (
        "a call without its id",
        {"model": "chat-only", "input": [{"role": "user", "content": "q"}, {"type": "function_call", "name": "f"}]},
        "invalid_request",
        "input[1].call_id",
    ),
    (
        "no user message",
        {"model": "chat-only", "input": [{"role": "system", "content": "x"}]},
        "invalid_request",
        "input",
    ),
    ("blank message", {"model": "chat-only", "input": "  "}, "invalid_request", "input"),
    (
        "a hosted tool",
        {"model": "chat-only", "input": "x", "tools": [{"type": "web_search"}]},
        "tools_not_supported",
        "tools[0]",
    ),
    (
        "a nameless tool",
        {"model": "chat-only", "input": "x", "tools": [{"type": "function", "name": ""}]},
        "invalid_request",
        "tools[0].name",
    ),
    (
        "tool_choice is a word",
        {"model": "chat-only", "input": "x", "tool_choice": "sometimes"},
        "invalid_request",
        "tool_choice",
    ),
    (
        "text.format is yaml",
        {"model": "chat-only", "input": "x", "text": {"format": {"type": "yaml"}}},
        "invalid_request",
        "text.format.type",
    ),
    ("metadata not strings", {"model": "chat-only", "input": "x", "metadata": {"a": 1}}, "invalid_request", "metadata"),
    ("stream is a string", {"model": "chat-only", "input": "x", "stream": "yes"}, "invalid_request", "stream"),
]


@pytest.mark.parametrize(
    ("case", "body", "code", "param"), HOSTILE_RESPONSE_BODIES, ids=[c[0] for c in HOSTILE_RESPONSE_BODIES]
)
async def test_hostile_response_bodies_get_openai_400s_naming_the_field(
    gateway: TestClient, case: str, body: Any, code: str, param: str | None
) -> None:
    """The field is named as OpenAI names it (`input[0].content`), in `param` and the message."""
    response = await gateway.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 400, (case, await response.text())
    error = (await response.json())["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)
    if param is not None and case != "blank message":  # (that one says what is missing: some text)
        assert error["message"].startswith(param)


async def test_hostile_response_queries(gateway: TestClient, sdk: openai.AsyncOpenAI) -> None:
    done = await sdk.responses.create(model="chat-only", input="q")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for query in ("stream=maybe", "stream=true&starting_after=-1", "stream=true&starting_after=1e3"):
        response = await gateway.get(f"/v1/responses/{done.id}?{query}", headers=auth)
        assert response.status == 400, query
        assert (await response.json())["error"]["type"] == "invalid_request_error"
    bad_input = await gateway.post("/v1/responses", json={"model": "chat-only", "input": 3}, headers=auth)
    assert (await bad_input.json())["error"]["param"] == "input"


async def test_run_admission_is_an_openai_429_with_retry_after(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply(text="never", hang=True)
    client = await make_gateway(tokens={TOKEN: "alice"}, overrides={"gateway": {"max_active_runs_per_actor": 1}})
    sdk = await sdk_for(client)
    try:
        first = await sdk.responses.create(model="chat-only", input="hang", background=True)
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.responses.create(model="chat-only", input="again", background=True)
        assert caught.value.response.headers["Retry-After"].isdigit()
        assert caught.value.body["type"] == "rate_limit_error"  # type: ignore[index]
        assert (await sdk.responses.cancel(first.id)).status == "cancelled"
    finally:
        await sdk.close()


async def test_another_actors_response_is_not_found(make_gateway: MakeGateway) -> None:
    client = await make_gateway(tokens={TOKEN: "alice", "tok-bob": "bob"})
    alice, bob = await sdk_for(client), await sdk_for(client, token="tok-bob")
    try:
        response = await alice.responses.create(model="chat-only", input="mine")
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(response.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.cancel(response.id)
    finally:
        await alice.close()
        await bob.close()


async def test_the_core_error_shape_is_unchanged_elsewhere(gateway: TestClient) -> None:
    response = await gateway.get("/v1/runs/nope")
    assert response.status == 401
    assert set((await response.json())["error"]) == {"code", "message"}


# -- tool activity --------------------------------------------------------------------------------------


async def test_tool_activity_is_summarised_without_paths_or_receipts(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """An ACP agent calls a gateway tool over MCP: chat chunks and Responses items name the tool
    and its status, and carry none of its arguments, results, receipt ids or paths."""
    from tests._knowledge_mcp import McpAgentPlugin, serve
    from tests._lightrag import WORKSPACE

    ws = tmp_path / "ws"
    (ws / "notes").mkdir(parents=True)
    (ws / "notes" / "a.md").write_text("a private note\n")
    plugin = McpAgentPlugin("http")
    client = await serve(
        await make_gateway(
            tokens={TOKEN: "alice"},
            overrides={"workspaces": {"roots": {WORKSPACE: str(ws)}}, "hermes": {"enabled": False}},
            extra_plugins=(plugin,),
        ),
        plugin,
    )
    sdk = await sdk_for(client)
    prompt = 'call workspace.read_file {"path": "notes/a.md"}'
    metadata = {"workspace_id": WORKSPACE, "allowed_roots": "notes/"}
    try:
        stream = await sdk.chat.completions.create(
            model="fake-mcp", messages=[{"role": "user", "content": prompt}], metadata=metadata, stream=True
        )
        tools = [
            c.model_extra["agent_gateway"]["tool"]
            async for c in stream
            if "tool" in c.model_extra.get("agent_gateway", {})
        ]  # type: ignore[union-attr]
        names = {t["name"] for t in tools}
        assert "workspace.read_file" in names, tools
        assert {t["status"] for t in tools if t["name"] == "workspace.read_file"} >= {"completed"}
        events = [
            e async for e in await sdk.responses.create(model="fake-mcp", input=prompt, metadata=metadata, stream=True)
        ]
        items = [
            e.item.model_dump()
            for e in events
            if e.type in ("response.output_item.added", "response.output_item.done") and e.item.type == "mcp_call"
        ]
        assert {i["name"] for i in items} >= {"workspace.read_file"}
        assert [i["status"] for i in items if i["name"] == "workspace.read_file"][-1] == "completed"
        final = events[-1].response.model_dump()  # type: ignore[union-attr]
        leaked = json.dumps(
            {"chat": tools, "items": items, "output": [o for o in final["output"] if o["type"] != "message"]}
        )
        for secret in (str(tmp_path), "notes/a.md", "receipt", "audit", "private note", 'arguments": "{'):
            assert secret not in leaked, secret
    finally:
        await sdk.close()


def test_config_check_reports_a_bad_reasoning_value(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agent_gateway.cli import cli

    path = tmp_path / "gateway.toml"
    path.write_text('[openai_compat]\nreasoning = "loud"\nenabled = "yes"\n', encoding="utf-8")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)])
    assert result.exit_code == 1
    assert "openai_compat.reasoning: must be one of 'omit', 'reasoning_content'" in result.output
    assert "openai_compat.enabled" in result.output


async def test_disabled_plugin_serves_nothing(make_gateway: MakeGateway) -> None:
    client = await make_gateway(overrides={"openai_compat": {"enabled": False}})
    response = await client.get("/v1/models")
    assert response.status == 404
    assert set((await response.json())["error"]) == {"code", "message"}  # the core's own 404


async def test_a_session_id_with_a_control_character_is_answered(gateway: TestClient) -> None:
    body = {"model": "chat-only", "messages": [{"role": "user", "content": "hi"}], "metadata": {"session_id": "a\x1bb"}}
    response = await gateway.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200, await response.text()
    assert "X-Agent-Gateway-Session" not in response.headers
    assert (await response.json())["agent_gateway"]["sessionId"] == "a\x1bb"
