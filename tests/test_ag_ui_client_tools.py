"""AG-UI frontend tools (``RunAgentInput.tools``): chat-only passes them to its upstream and the
model's calls come back as TOOL_CALL_START / ARGS / END (valid for the official client's
``verifyEvents``); the client's result in the next input reaches the upstream. An ACP agent cannot
take them: 400 ``tools_not_supported``, or with ``[ag_ui] client_tools = "ignore"`` a run without
them that says so in RUN_STARTED."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._ag_ui import FakeAcpPlugin, agui_input, check, js_verify, parse, post_run
from tests._harness import MakeGateway

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.peers  # the official @ag-ui/client checks the events
async def test_frontend_tool_round_trip_on_chat_only(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    client = await make_gateway()
    fake_llm.add(
        Reply(tool_calls=[{"id": "call_w", "name": "get_weather", "arguments": {"city": "Paris"}}]),
        Reply(text="Sunny in Paris."),
    )
    first = agui_input("Weather in Paris?", tools=[WEATHER])
    response, raw = await post_run(client, "chat-only", first)
    assert response.status == 200, raw[:500]
    events = [e for _id, e in parse(raw)]
    check(events)
    assert await js_verify(tmp_path, [events]) == ["ok"]
    start = next(e for e in events if e["type"] == "TOOL_CALL_START")
    assert (start["toolCallId"], start["toolCallName"]) == ("call_w", "get_weather")
    arguments = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(arguments) == {"city": "Paris"}
    assert [e["type"] for e in events if e.get("toolCallId") == "call_w"] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
    ]
    assert fake_llm.requests[0]["tools"] == [{"type": "function", "function": WEATHER}]

    # The client runs the tool and sends its result with the thread's messages.
    call = {"id": "call_w", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    messages: list[dict[str, Any]] = [
        *first["messages"],
        {"id": "a1", "role": "assistant", "toolCalls": [call]},
        {"id": "t1", "role": "tool", "toolCallId": "call_w", "content": "sunny"},
    ]
    second = agui_input("unused", tools=[WEATHER], threadId=first["threadId"], messages=messages)
    response, raw = await post_run(client, "chat-only", second)
    events = [e for _id, e in parse(raw)]
    check(events)
    assert "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT") == "Sunny in Paris."
    forwarded = fake_llm.requests[1]["messages"]
    assert [m["role"] for m in forwarded[-3:]] == ["user", "assistant", "tool"]
    assert [m["content"] for m in forwarded if m["role"] == "user"] == ["Weather in Paris?"]
    assert forwarded[-2]["tool_calls"] == [call]
    assert forwarded[-1] == {"role": "tool", "tool_call_id": "call_w", "content": "sunny"}


async def test_tools_for_an_acp_agent_are_refused(make_gateway: MakeGateway) -> None:
    client = await make_gateway(extra_plugins=(FakeAcpPlugin(),))
    response, raw = await post_run(client, "fake-basic", agui_input("hi", tools=[WEATHER]))
    assert response.status == 400
    error = json.loads(raw)["error"]
    assert error["code"] == "tools_not_supported"
    # Without tools the same agent runs as before.
    response, raw = await post_run(client, "fake-basic", agui_input("hi"))
    assert response.status == 200
    check([e for _id, e in parse(raw)])


async def test_the_ignore_switch_says_what_it_left_out(make_gateway: MakeGateway) -> None:
    client = await make_gateway(extra_plugins=(FakeAcpPlugin(),), overrides={"ag_ui": {"client_tools": "ignore"}})
    response, raw = await post_run(client, "fake-basic", agui_input("hi", tools=[WEATHER]))
    assert response.status == 200
    assert response.headers["X-Agent-Gateway-Ignored"] == "tools"
    events = [e for _id, e in parse(raw)]
    check(events)
    assert events[0]["metadata"]["agentGateway"]["ignored"] == ["tools"]
    assert "echo: hi" in "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
