"""Token usage comes through: runtimes journal ``usage.updated`` in one shape, and the
OpenAI-compatible endpoints (read with the official ``openai`` SDK) report it.

chat-only passes on the upstream's ``usage`` (the fake upstream sends it when asked with
``stream_options.include_usage``); an ACP agent's ``session/prompt`` result ``usage`` is the turn's
tokens, its ``usage_update`` the session's context window; Pi's per-message usage is summed over the run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway import AcpAgentSpec, AcpRuntime, hookimpl
from agent_gateway.plugins.pi_lab.mapping import EventMapper
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import FAKE_ACP_AGENT, WAIT, MakeGateway, events_page

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "tok-usage"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ACP_AGENT = "fake-acp"
UPSTREAM_USAGE = {
    "prompt_tokens": 31,
    "completion_tokens": 12,
    "total_tokens": 43,
    "prompt_tokens_details": {"cached_tokens": 8},
    "completion_tokens_details": {"reasoning_tokens": 5},
}


class FakeAcpPlugin:
    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"]
        register(AcpRuntime(AcpAgentSpec(ACP_AGENT, "Fake ACP", "fake-acp", command, env=env)))


@pytest.fixture
async def gateway(make_gateway: MakeGateway) -> TestClient:
    return await make_gateway(tokens={TOKEN: "alice"}, extra_plugins=(FakeAcpPlugin(),))


@pytest.fixture
async def sdk(gateway: TestClient) -> Any:
    client = openai.AsyncOpenAI(base_url=str(gateway.make_url("/v1")), api_key=TOKEN, max_retries=0, timeout=WAIT)
    async with client:
        yield client


def scripted(fake_llm: FakeOpenAI, count: int = 1) -> None:
    for _ in range(count):
        fake_llm.add(Reply(text="counted answer", usage=UPSTREAM_USAGE))


def check_chat_usage(usage: Any) -> None:
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (31, 12, 43)
    assert usage.prompt_tokens_details.cached_tokens == 8
    assert usage.completion_tokens_details.reasoning_tokens == 5


async def test_chat_only_usage_in_a_chat_completion(
    sdk: openai.AsyncOpenAI, gateway: TestClient, fake_llm: FakeOpenAI
) -> None:
    scripted(fake_llm)
    completion = await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "counted answer"
    check_chat_usage(completion.usage)
    # The gateway asked the upstream for usage, and journalled it in the one shape runtimes share.
    assert fake_llm.requests[-1]["stream_options"] == {"include_usage": True}
    host_run_id = completion.model_extra["agent_gateway"]["hostRunId"]  # type: ignore[index]
    usage_events = [e for e in await events_page(gateway, host_run_id, AUTH) if e["kind"] == "usage.updated"]
    assert [e["payload"] for e in usage_events] == [
        {"inputTokens": 31, "outputTokens": 12, "totalTokens": 43, "cachedReadTokens": 8, "thoughtTokens": 5}
    ]


async def test_chat_only_usage_in_the_include_usage_chunk(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    scripted(fake_llm, 2)
    stream = await sdk.chat.completions.create(
        model="chat-only",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == []
    check_chat_usage(chunks[-1].usage)
    assert all(chunk.usage is None for chunk in chunks[:-1])
    # Without include_usage there is no usage chunk, as OpenAI does.
    plain = await sdk.chat.completions.create(
        model="chat-only", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert all(chunk.choices and chunk.usage is None for chunk in [chunk async for chunk in plain])


async def test_chat_only_usage_in_responses(sdk: openai.AsyncOpenAI, fake_llm: FakeOpenAI) -> None:
    scripted(fake_llm, 2)
    response = await sdk.responses.create(model="chat-only", input="hi")
    assert response.output_text == "counted answer"
    usage = response.usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (31, 12, 43)
    assert usage.input_tokens_details.cached_tokens == 8
    assert usage.output_tokens_details.reasoning_tokens == 5
    stream = await sdk.responses.create(model="chat-only", input="hi", stream=True)
    completed = [event async for event in stream if event.type == "response.completed"]
    assert len(completed) == 1 and completed[0].response.usage is not None
    assert completed[0].response.usage.total_tokens == 43
    # Read again later, the stored response carries it too.
    again = await sdk.responses.retrieve(completed[0].response.id)
    assert again.usage is not None and again.usage.total_tokens == 43


async def test_unscripted_upstream_usage_is_non_zero(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(model="chat-only", messages=[{"role": "user", "content": "hello"}])
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


async def test_acp_prompt_usage_is_reported(sdk: openai.AsyncOpenAI, gateway: TestClient) -> None:
    # The fake agent reports usage as Hermes does: usage_update {used, size}, then the result's usage
    # (the prompt's and the reply's words as tokens).
    prompt = "count this with usage"
    completion = await sdk.chat.completions.create(model=ACP_AGENT, messages=[{"role": "user", "content": prompt}])
    reply = completion.choices[0].message.content or ""
    assert reply == "echo: " + prompt
    usage = completion.usage
    assert usage is not None and usage.completion_tokens == len(reply.split())
    assert usage.prompt_tokens >= len(prompt.split())  # the gateway may add a preamble to the prompt
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details.reasoning_tokens == 1
    extension = completion.model_extra["agent_gateway"]  # type: ignore[index]
    detail = await (await gateway.get(f"/v1/sessions/{extension['sessionId']}", headers=AUTH)).json()
    # The transcript keeps both: the session's context window and the turn's tokens.
    transcript_usage = detail["runs"][-1]["transcript"]["usage"]
    assert transcript_usage["size"] == 1000 and transcript_usage["used"] == usage.total_tokens
    assert transcript_usage["outputTokens"] == usage.completion_tokens
    # A turn without token counts (only context, or nothing) leaves usage null.
    plain = await sdk.chat.completions.create(model=ACP_AGENT, messages=[{"role": "user", "content": "no count"}])
    assert plain.usage is None


async def test_acp_usage_in_the_stream_and_responses(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=ACP_AGENT,
        messages=[{"role": "user", "content": "stream with usage"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len("echo: stream with usage".split())
    response = await sdk.responses.create(model=ACP_AGENT, input="respond with usage")
    assert response.usage is not None and response.usage.output_tokens == len("echo: respond with usage".split())


def test_pi_usage_is_summed_over_the_run() -> None:
    """Each Pi assistant message is one model call with its own usage: the run reports the sum."""
    mapper = EventMapper()

    def message_end(input_: int, output: int, cache_read: int, cost: float) -> list[tuple[str, dict[str, Any]]]:
        usage = {
            "input": input_,
            "output": output,
            "cacheRead": cache_read,
            "cacheWrite": 0,
            "totalTokens": input_ + output + cache_read,
            "cost": {"total": cost},
        }
        message = {"role": "assistant", "content": [], "stopReason": "toolUse", "usage": usage, "model": "m"}
        return mapper.map({"type": "message_end", "message": message})

    first = dict(message_end(100, 20, 0, 0.5))["usage.updated"]
    assert first == {
        "inputTokens": 100,
        "outputTokens": 20,
        "totalTokens": 120,
        "cachedReadTokens": 0,
        "cachedWriteTokens": 0,
        "cost": {"amount": 0.5, "currency": "USD"},
        "model": "m",
    }
    second = dict(message_end(10, 30, 100, 0.25))["usage.updated"]
    assert (second["inputTokens"], second["outputTokens"], second["totalTokens"]) == (210, 50, 260)
    assert second["cachedReadTokens"] == 100 and second["cost"] == {"amount": 0.75, "currency": "USD"}
