"""Client tools and structured output through the OpenAI-compatible endpoints, driven by real
clients: the ``openai`` SDK (chat completions and responses, streamed and not), pydantic-ai's
structured output, an OpenAI Agents SDK ``function_tool`` and LangChain's ``bind_tools``, all on
chat-only over the fake upstream, whose request log proves what it received. An ACP agent (the
fake ACP agent as a real subprocess) cannot take client tools: 400 ``tools_not_supported``, or with
``[openai_compat] client_tools = "ignore"`` a run without them that says so.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway
from tests._openai import ACP_AGENT, TOKEN, FakeAcpPlugin, sdk_for

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QUESTION = "What is the weather in Paris?"


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


async def run_events(gateway: TestClient, host_run_id: str) -> list[dict[str, Any]]:
    response = await gateway.get(
        f"/v1/runs/{host_run_id}/events", headers={"Authorization": f"Bearer {TOKEN}"}, params={"limit": "1000"}
    )
    assert response.status == 200, await response.text()
    body = await response.json()
    events: list[dict[str, Any]] = body["events"] if isinstance(body, dict) else body
    return events


def tool_call_reply(call_id: str = "call_weather", city: str = "Paris") -> Reply:
    return Reply(tool_calls=[{"id": call_id, "name": "get_weather", "arguments": {"city": city}}])


# -- the openai SDK: chat completions ------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_tool_call_round_trip(
    sdk: openai.AsyncOpenAI, gateway: TestClient, fake_llm: FakeOpenAI, stream: bool
) -> None:
    fake_llm.add(tool_call_reply(), Reply(text="It is sunny in Paris."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    tools: Any = [WEATHER_TOOL]
    if stream:
        chunks = [
            chunk
            async for chunk in await sdk.chat.completions.create(
                model="chat-only", messages=messages, tools=tools, tool_choice="auto", stream=True
            )
        ]
        calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
        assert [(c.index, c.id, c.function.name) for c in calls] == [(0, "call_weather", "get_weather")]  # type: ignore[union-attr]
        arguments = "".join(c.function.arguments or "" for c in calls)  # type: ignore[union-attr]
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
            "tool_calls"
        ]
        extension = chunks[-1].model_extra["agent_gateway"]  # type: ignore[index]
        call_message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_weather", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        }
    else:
        first = await sdk.chat.completions.create(
            model="chat-only", messages=messages, tools=tools, tool_choice="auto", parallel_tool_calls=False
        )
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content is None
        (call,) = choice.message.tool_calls or ()
        assert (call.id, call.function.name) == ("call_weather", "get_weather")  # type: ignore[union-attr]
        arguments = call.function.arguments  # type: ignore[union-attr]
        extension = first.model_extra["agent_gateway"]  # type: ignore[index]
        call_message = choice.message.model_dump(exclude_none=True)
    assert json.loads(arguments) == {"city": "Paris"}
    # The upstream got the client's tools as the client sent them.
    upstream = fake_llm.requests[0]
    assert upstream["tools"] == [WEATHER_TOOL]
    assert upstream["tool_choice"] == "auto"
    if not stream:
        assert upstream["parallel_tool_calls"] is False

    # The client runs the tool and resends the history with its result.
    messages += [call_message, {"role": "tool", "tool_call_id": "call_weather", "content": "sunny, 24 C"}]
    second = await sdk.chat.completions.create(model="chat-only", messages=messages, tools=tools)
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"
    forwarded = fake_llm.requests[1]["messages"]
    assert forwarded[-3]["role"] == "user" and forwarded[-3]["content"] == QUESTION
    assert forwarded[-2]["role"] == "assistant"
    assert forwarded[-2]["tool_calls"][0]["id"] == "call_weather"
    assert forwarded[-2]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert forwarded[-1] == {"role": "tool", "tool_call_id": "call_weather", "content": "sunny, 24 C"}

    # Both runs journal it: the call the model asked for, the result the client sent.
    asked = [e for e in await run_events(gateway, extension["hostRunId"]) if e["kind"] == "client_tool.requested"]
    assert [e["payload"] for e in asked] == [
        {"toolCallId": "call_weather", "name": "get_weather", "arguments": arguments}
    ]
    second_run = second.model_extra["agent_gateway"]["hostRunId"]  # type: ignore[index]
    answered = [e for e in await run_events(gateway, second_run) if e["kind"] == "client_tool.answered"]
    assert [e["payload"] for e in answered] == [{"toolCallId": "call_weather", "content": "sunny, 24 C"}]


async def test_a_pinned_session_sends_the_question_once(
    sdk: openai.AsyncOpenAI, gateway: TestClient, fake_llm: FakeOpenAI
) -> None:
    fake_llm.add(tool_call_reply(), Reply(text="Sunny."))
    pinned = {"session_id": "weather-session"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    first = await sdk.chat.completions.create(
        model="chat-only",
        messages=messages,
        tools=[WEATHER_TOOL],
        metadata=pinned,  # type: ignore[list-item]
    )
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_weather", "content": "sunny"},
    ]
    await sdk.chat.completions.create(model="chat-only", messages=messages, tools=[WEATHER_TOOL], metadata=pinned)  # type: ignore[arg-type, list-item]
    forwarded = fake_llm.requests[1]["messages"]
    assert [m["content"] for m in forwarded if m["role"] == "user"] == [QUESTION]
    assert [m["role"] for m in forwarded[-3:]] == ["user", "assistant", "tool"]
    # The session's history shows the call as a tool card of the first run, then the answer.
    detail = await gateway.get("/v1/sessions/weather-session", headers={"Authorization": f"Bearer {TOKEN}"})
    runs = (await detail.json())["runs"]
    transcripts = sorted((r["transcript"] for r in runs), key=lambda t: len(t["tools"]), reverse=True)
    cards = transcripts[0]["tools"]
    assert [(c["toolCallId"], c["tool"], c["status"]) for c in cards] == [("call_weather", "get_weather", "client")]
    assert transcripts[1]["answer"]["text"] == "Sunny."


async def test_response_format_json_schema_passes_through(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "city",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
                "required": ["name", "country"],
                "additionalProperties": False,
            },
        },
    }
    fake_llm.add('{"name": "Paris", "country": "France"}')
    completion = await sdk.chat.completions.create(
        model="chat-only",
        messages=[{"role": "user", "content": "The capital of France?"}],
        response_format=schema,  # type: ignore[arg-type]
    )
    assert json.loads(completion.choices[0].message.content or "") == {"name": "Paris", "country": "France"}
    assert fake_llm.requests[0]["response_format"] == schema
    assert "tools" not in fake_llm.requests[0]


# -- the openai SDK: responses ------------------------------------------------------------------------


RESPONSES_TOOL = {"type": "function", **WEATHER_TOOL["function"]}  # type: ignore[dict-item]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_function_call_round_trip_through_responses(
    sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI, stream: bool
) -> None:
    fake_llm.add(tool_call_reply(), Reply(text="Sunny in Paris."))
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    if stream:
        events = [
            e
            async for e in await sdk.responses.create(
                model="chat-only",
                input=items,
                tools=[RESPONSES_TOOL],
                stream=True,  # type: ignore[list-item]
            )
        ]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]  # type: ignore[union-attr]
        assert [json.loads(a) for a in done] == [{"city": "Paris"}]
        response = events[-1].response  # type: ignore[union-attr]
    else:
        response = await sdk.responses.create(model="chat-only", input=items, tools=[RESPONSES_TOOL])  # type: ignore[list-item]
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == ("call_weather", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert fake_llm.requests[0]["tools"] == [WEATHER_TOOL]

    result = {"type": "function_call_output", "call_id": "call_weather", "output": "sunny"}
    items += [call.model_dump(exclude_none=True), result]
    answer = await sdk.responses.create(model="chat-only", input=items, tools=[RESPONSES_TOOL])  # type: ignore[list-item]
    assert answer.output_text == "Sunny in Paris."
    forwarded = fake_llm.requests[1]["messages"]
    assert [m["role"] for m in forwarded[-3:]] == ["user", "assistant", "tool"]
    assert forwarded[-2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": call.arguments}  # type: ignore[union-attr]
    assert forwarded[-1] == {"role": "tool", "tool_call_id": "call_weather", "content": "sunny"}


async def test_tool_results_after_previous_response_id(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    """A client that lets the server keep the conversation sends only the results."""
    fake_llm.add(tool_call_reply(), Reply(text="Sunny."))
    first = await sdk.responses.create(model="chat-only", input=QUESTION, tools=[RESPONSES_TOOL])  # type: ignore[list-item]
    (call,) = [item for item in first.output if item.type == "function_call"]
    answer = await sdk.responses.create(
        model="chat-only",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],  # type: ignore[union-attr]
        tools=[RESPONSES_TOOL],  # type: ignore[list-item]
    )
    assert answer.output_text == "Sunny."
    forwarded = fake_llm.requests[1]["messages"]
    assert [m["content"] for m in forwarded if m["role"] == "user"] == [QUESTION]
    assert [m["role"] for m in forwarded[-3:]] == ["user", "assistant", "tool"]
    assert forwarded[-2]["tool_calls"][0]["id"] == "call_weather"
    assert forwarded[-1] == {"role": "tool", "tool_call_id": "call_weather", "content": "sunny"}


async def test_responses_text_format_becomes_response_format(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    fake_llm.add('{"ok": true}')
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    response = await sdk.responses.create(
        model="chat-only",
        input="ok?",
        text={"format": {"type": "json_schema", "name": "ok", "schema": schema, "strict": True}},
    )
    assert json.loads(response.output_text) == {"ok": True}
    assert fake_llm.requests[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "ok", "schema": schema, "strict": True},
    }


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
            "messages[1].tool_call_id",
        ),
    ],
)
async def test_malformed_client_tools_are_a_400_naming_the_field(
    gateway: TestClient, fake_llm: FakeOpenAI, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "chat-only", "messages": [{"role": "user", "content": "q"}], **extra}
    response = await gateway.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 400
    error = (await response.json())["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert fake_llm.requests == []  # nothing reached the upstream


# -- a runtime that cannot take client tools ----------------------------------------------------------


async def test_tools_on_an_acp_agent_are_refused(sdk: openai.AsyncOpenAI, gateway: TestClient) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.chat.completions.create(
            model=ACP_AGENT,
            messages=[{"role": "user", "content": QUESTION}],
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
        )
    assert caught.value.code == "tools_not_supported"
    assert caught.value.param == "tools"
    assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.responses.create(model=ACP_AGENT, input=QUESTION, tools=[RESPONSES_TOOL])  # type: ignore[list-item]
    assert caught.value.code == "tools_not_supported"
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.chat.completions.create(
            model=ACP_AGENT, messages=[{"role": "user", "content": "x"}], response_format={"type": "json_object"}
        )
    assert caught.value.code == "response_format_not_supported"
    # Refused before anything exists: no run, no session.
    sessions = await gateway.get("/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (await sessions.json())["sessions"] == []


async def test_the_ignore_switch_runs_without_them_and_says_so(make_gateway: MakeGateway) -> None:
    client = await make_gateway(
        tokens={TOKEN: "alice"},
        extra_plugins=(FakeAcpPlugin(),),
        overrides={"openai_compat": {"client_tools": "ignore"}},
    )
    sdk = await sdk_for(client)
    try:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=ACP_AGENT,
            messages=[{"role": "user", "content": "hello"}],
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="auto",
        )
        assert raw.headers["X-Agent-Gateway-Ignored"] == "tools, tool_choice"
        completion = raw.parse()
        assert completion.choices[0].message.content == "echo: hello"
        assert completion.model_extra["agent_gateway"]["ignored"] == ["tools", "tool_choice"]  # type: ignore[index]
        chunks = [
            c
            async for c in await sdk.chat.completions.create(
                model=ACP_AGENT,
                messages=[{"role": "user", "content": "hi"}],
                tools=[WEATHER_TOOL],
                stream=True,  # type: ignore[list-item]
            )
        ]
        assert chunks[-1].model_extra["agent_gateway"]["ignored"] == ["tools"]  # type: ignore[index]
        response = await sdk.responses.create(model=ACP_AGENT, input="hey", tools=[RESPONSES_TOOL])  # type: ignore[list-item]
        assert response.model_extra["agent_gateway"]["ignored"] == ["tools"]  # type: ignore[index]
        assert response.output_text == "echo: hey"
    finally:
        await sdk.close()


def test_config_check_refuses_a_bad_client_tools_value(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agent_gateway.cli import cli

    path = tmp_path / "gateway.toml"
    path.write_text('[openai_compat]\nclient_tools = "drop"\n', encoding="utf-8")
    result = CliRunner().invoke(cli, ["config", "check", "--config", str(path)])
    assert result.exit_code == 1
    assert "openai_compat.client_tools: must be one of 'reject', 'ignore'" in result.output


# -- pydantic-ai, the Agents SDK, LangChain ------------------------------------------------------------


def _answer_with_the_offered_tool(arguments: dict[str, Any]) -> Any:
    """The fake upstream's default: call the tool the request offers (whatever the client names it)."""

    def reply(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(text="done")
        name = body["tools"][0]["function"]["name"]
        return Reply(tool_calls=[{"name": name, "arguments": arguments}])

    return reply


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_stream"])
async def test_pydantic_ai_structured_output(gateway: TestClient, fake_llm: FakeOpenAI, stream: bool) -> None:
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class City(BaseModel):
        name: str
        country: str

    fake_llm.default = _answer_with_the_offered_tool({"name": "Paris", "country": "France"})
    provider = OpenAIProvider(base_url=str(gateway.make_url("/v1")), api_key=TOKEN)
    agent = Agent(OpenAIChatModel("chat-only", provider=provider), output_type=City)
    if stream:
        async with agent.run_stream("The capital of France?") as streamed:
            output = await streamed.get_output()
    else:
        output = (await agent.run("The capital of France?")).output
    assert output == City(name="Paris", country="France")
    # pydantic-ai's output tool reached the upstream as a tool the model must call.
    (tool,) = fake_llm.requests[0]["tools"]
    assert tool["function"]["parameters"]["properties"].keys() == {"name", "country"}


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_agents_sdk_function_tool(gateway: TestClient, fake_llm: FakeOpenAI, api: str, stream: bool) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    looked_up: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return f"sunny in {city}"

    fake_llm.default = _answer_with_the_offered_tool({"city": "Paris"})
    client = openai.AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key=TOKEN, max_retries=0, timeout=WAIT)
    model: Any = (
        OpenAIChatCompletionsModel(model="chat-only", openai_client=client)
        if api == "chat_completions"
        else OpenAIResponsesModel(model="chat-only", openai_client=client)
    )
    try:
        agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model)
        if stream:
            streamed = Runner.run_streamed(agent, QUESTION)
            async for _event in streamed.stream_events():
                pass
            final_output = streamed.final_output
        else:
            final_output = (await Runner.run(agent, QUESTION)).final_output
    finally:
        await client.close()
    assert looked_up == ["Paris"]
    assert final_output == "done"
    second = fake_llm.requests[1]["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["content"] == "sunny in Paris"


async def test_langchain_bind_tools(gateway: TestClient, fake_llm: FakeOpenAI) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    fake_llm.default = _answer_with_the_offered_tool({"city": "Paris"})
    chat = ChatOpenAI(model="chat-only", base_url=str(gateway.make_url("/v1")), api_key=TOKEN, max_retries=0)  # type: ignore[arg-type]
    message = await chat.bind_tools([get_weather]).ainvoke(QUESTION)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": "Paris"})]  # type: ignore[attr-defined]
    assert fake_llm.requests[0]["tools"][0]["function"]["name"] == "get_weather"


# -- the documented examples ---------------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "openai-compatible.md"


def doc_block(name: str) -> str:
    (block,) = re.findall(rf"^```python {name}\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)
    return str(block)


async def test_the_documented_tool_loop_runs_against_the_gateway(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    client = await make_gateway(tokens={"my-gateway-token": "docs"})
    fake_llm.add(tool_call_reply(), Reply(text="Sunny in Paris."), '{"name": "Paris", "country": "France"}')
    code = doc_block("client-tools").replace("http://127.0.0.1:8787/v1", str(client.make_url("/v1")))
    printed = io.StringIO()

    def run() -> None:  # the synchronous SDK, off the event loop that serves the gateway
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(DOC), "exec"), {})

    async with asyncio.timeout(WAIT):
        await asyncio.to_thread(run)
    assert printed.getvalue() == "Sunny in Paris.\n{'name': 'Paris', 'country': 'France'}\n"
    assert fake_llm.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_weather",
        "content": "sunny, 24 C in Paris",
    }
    assert fake_llm.requests[2]["response_format"]["json_schema"]["name"] == "city"


@pytest.mark.parametrize("name", ["pydantic-ai", "agents-sdk"])
def test_the_documented_framework_examples_parse(name: str) -> None:
    ast.parse(doc_block(name))
