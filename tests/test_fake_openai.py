"""Tests for the scriptable fake OpenAI-compatible server (agent_gateway.testing.fake_openai)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    server = FakeOpenAI()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _sse_chunks(response: aiohttp.ClientResponse) -> list[Any]:
    """Parse an SSE body into JSON chunks; the ``[DONE]`` sentinel becomes ``"[DONE]"``."""
    chunks: list[Any] = []
    body = (await response.read()).decode()
    for event in body.split("\n\n"):
        if not event.strip():
            continue
        assert event.startswith("data: "), event
        data = event[len("data: ") :]
        chunks.append(data if data == "[DONE]" else json.loads(data))
    return chunks


async def _chat(session: aiohttp.ClientSession, base_url: str, **body: Any) -> aiohttp.ClientResponse:
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return await session.post(f"{base_url}/chat/completions", json=body)


def _reassemble(chunks: list[Any]) -> dict[str, Any]:
    text, reasoning, finish = "", "", None
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        if chunk == "[DONE]":
            continue
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["id"].startswith("chatcmpl-")
        for choice in chunk["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                function = tc.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return {
        "text": text,
        "reasoning": reasoning,
        "finish": finish,
        "calls": [calls[i] for i in sorted(calls)],
    }


async def test_streaming_text_reassembles(fake: FakeOpenAI) -> None:
    scripted = "Hello there, this is a fairly long scripted answer. Ünïcödé ✓"
    fake.add(Reply(text=scripted, reasoning="thinking hard", chunk_size=5))
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True)
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        chunks = await _sse_chunks(response)
    assert chunks[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # many content pieces, none longer than chunk_size
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert len([p for p in pieces if p]) == math.ceil(len(scripted) / 5)
    assert all(len(p) <= 5 for p in pieces if p)
    result = _reassemble(chunks)
    assert result["text"] == scripted
    assert result["reasoning"] == "thinking hard"
    assert result["finish"] == "stop"
    assert result["calls"] == []
    # reasoning comes before text
    kinds = [next(iter(c["choices"][0]["delta"]), None) for c in chunks[1:-1]]
    assert kinds.index("reasoning_content") < kinds.index("content")


async def test_streaming_tool_calls_reassemble(fake: FakeOpenAI) -> None:
    args = {"path": "src/main.py", "limit": 200, "nested": {"a": [1, 2, 3]}}
    fake.add(
        Reply(
            text="Let me look.",
            tool_calls=[
                {"id": "call_a", "name": "read_file", "arguments": args},
                {"name": "ls", "arguments": '{"dir": "."}'},
            ],
            chunk_size=4,
        )
    )
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True)
        chunks = await _sse_chunks(response)
    result = _reassemble(chunks)
    assert result["text"] == "Let me look."
    assert result["finish"] == "tool_calls"
    assert [c["name"] for c in result["calls"]] == ["read_file", "ls"]
    assert result["calls"][0]["id"] == "call_a"
    assert result["calls"][1]["id"].startswith("call_")
    assert json.loads(result["calls"][0]["arguments"]) == args
    assert json.loads(result["calls"][1]["arguments"]) == {"dir": "."}
    # arguments really were split across chunks, in OpenAI's incremental form
    arg_chunks = [
        tc for c in chunks[:-1] for tc in c["choices"][0]["delta"].get("tool_calls") or [] if tc["index"] == 0
    ]
    assert len(arg_chunks) > 3
    assert arg_chunks[0]["type"] == "function"
    assert arg_chunks[0]["function"]["name"] == "read_file"
    assert "id" not in arg_chunks[1]


async def test_stream_usage_chunk(fake: FakeOpenAI) -> None:
    fake.add(
        Reply(
            text="abc",
            usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        )
    )
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True, stream_options={"include_usage": True})
        chunks = await _sse_chunks(response)
    assert chunks[-1] == "[DONE]"
    usage_chunk = chunks[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
    }
    assert chunks[-3]["choices"][0]["finish_reason"] == "stop"
    assert all(c["usage"] is None for c in chunks[:-2])


async def test_non_streaming(fake: FakeOpenAI) -> None:
    fake.add(
        "plain string reply",
        Reply(tool_calls=[{"id": "call_9", "name": "grep", "arguments": {"q": "x"}}]),
    )
    async with aiohttp.ClientSession() as session:
        first = await (await _chat(session, fake.base_url, model="other")).json()
        second = await (await _chat(session, fake.base_url)).json()
        third = await (await _chat(session, fake.base_url, messages=[{"role": "user", "content": "ping"}])).json()
    assert first["object"] == "chat.completion"
    assert first["model"] == "other"
    assert first["choices"][0]["message"] == {
        "role": "assistant",
        "content": "plain string reply",
    }
    assert first["choices"][0]["finish_reason"] == "stop"
    assert first["usage"]["total_tokens"] > 0
    message = second["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {
            "id": "call_9",
            "type": "function",
            "function": {"name": "grep", "arguments": '{"q": "x"}'},
        }
    ]
    assert second["choices"][0]["finish_reason"] == "tool_calls"
    # queue empty → echo of the last user message
    assert third["choices"][0]["message"]["content"] == "echo: ping"


async def test_default_callable_and_string() -> None:
    def script(body: dict[str, Any]) -> Reply | str:
        return f"{len(body['messages'])} messages"

    async with FakeOpenAI(default=script) as fake, aiohttp.ClientSession() as session:
        data = await (await _chat(session, fake.base_url)).json()
        assert data["choices"][0]["message"]["content"] == "1 messages"
    async with (
        FakeOpenAI(["first"], default="fixed") as fake,
        aiohttp.ClientSession() as session,
    ):
        texts = []
        for _ in range(3):
            data = await (await _chat(session, fake.base_url)).json()
            texts.append(data["choices"][0]["message"]["content"])
        assert texts == ["first", "fixed", "fixed"]


async def test_echo_handles_content_parts(fake: FakeOpenAI) -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "part one, "},
                {"type": "text", "text": "two"},
            ],
        },
        {"role": "assistant", "content": "ok"},
    ]
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, messages=messages, stream=True)
        result = _reassemble(await _sse_chunks(response))
    assert result["text"] == "echo: part one, two"


async def test_embeddings(fake: FakeOpenAI) -> None:
    url = f"{fake.base_url}/embeddings"
    async with aiohttp.ClientSession() as session:
        one = await (await session.post(url, json={"model": "m", "input": "hello"})).json()
        many = await (await session.post(url, json={"model": "m", "input": ["hello", "world"]})).json()
        b64 = await (
            await session.post(
                url,
                json={
                    "model": "m",
                    "input": ["hello", "world"],
                    "encoding_format": "base64",
                },
            )
        ).json()
        wide = await (await session.post(url, json={"input": "hello", "dimensions": 40})).json()
    vector = one["data"][0]["embedding"]
    assert one["object"] == "list"
    assert len(vector) == 16
    assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-5)
    assert many["data"][0]["embedding"] == vector  # deterministic
    assert many["data"][1]["embedding"] != vector
    assert [d["index"] for d in many["data"]] == [0, 1]
    for plain, encoded in zip(many["data"], b64["data"], strict=True):
        decoded = list(struct.unpack("<16f", base64.b64decode(encoded["embedding"])))
        assert decoded == plain["embedding"]
    assert len(wide["data"][0]["embedding"]) == 40
    assert [r["input"] for r in fake.embedding_requests][:2] == [
        "hello",
        ["hello", "world"],
    ]
    assert fake.requests == []


async def test_embedding_dim_and_bad_input() -> None:
    async with FakeOpenAI(embedding_dim=7) as fake, aiohttp.ClientSession() as session:
        ok = await session.post(f"{fake.base_url}/embeddings", json={"input": "x"})
        assert len((await ok.json())["data"][0]["embedding"]) == 7
        bad = await session.post(f"{fake.base_url}/embeddings", json={"input": []})
        assert bad.status == 400
        assert (await bad.json())["error"]["type"] == "invalid_request_error"


async def test_error_status(fake: FakeOpenAI) -> None:
    fake.add(Reply(status=429, error_message="slow down"), Reply(status=503), "after")
    async with aiohttp.ClientSession() as session:
        first = await _chat(session, fake.base_url, stream=True)
        second = await _chat(session, fake.base_url)
        third = await _chat(session, fake.base_url)
        assert first.status == 429
        error = (await first.json())["error"]
        assert error["message"] == "slow down"
        assert error["type"] == "rate_limit_error"
        assert second.status == 503
        assert (await second.json())["error"]["type"] == "server_error"
        assert (await third.json())["choices"][0]["message"]["content"] == "after"
        broken = await session.post(f"{fake.base_url}/chat/completions", data=b"{not json")
        assert broken.status == 400
        assert "error" in await broken.json()


async def test_requests_recorded_and_wait(fake: FakeOpenAI) -> None:
    async with aiohttp.ClientSession() as session:
        waiter = asyncio.create_task(fake.wait_for_requests(2, timeout=5))
        await asyncio.sleep(0)
        assert not waiter.done()
        await _chat(session, fake.base_url, messages=[{"role": "user", "content": "one"}])
        await _chat(
            session,
            fake.base_url,
            messages=[{"role": "user", "content": "two"}],
            stream=True,
        )
        recorded = await waiter
    assert [r["messages"][0]["content"] for r in recorded] == ["one", "two"]
    assert fake.requests[1]["stream"] is True
    assert await fake.wait_for_requests(1) == fake.requests  # already satisfied
    with pytest.raises(TimeoutError):
        await fake.wait_for_requests(3, timeout=0.05)


async def test_models_and_unprefixed_routes(fake: FakeOpenAI) -> None:
    root = fake.base_url.removesuffix("/v1")
    async with aiohttp.ClientSession() as session:
        models = await (await session.get(f"{fake.base_url}/models")).json()
        assert [m["id"] for m in models["data"]] == ["m"]
        assert (await (await session.get(f"{root}/models")).json()) == models
        assert (await session.get(f"{fake.base_url}/models/m")).status == 200
        assert (await session.get(f"{fake.base_url}/models/nope")).status == 404
        data = await (await _chat(session, root)).json()
        assert data["choices"][0]["message"]["content"] == "echo: hi"
        emb = await session.post(f"{root}/embeddings", json={"input": "x"})
        assert emb.status == 200


async def test_auth_enforced() -> None:
    async with FakeOpenAI(api_key="sk-test", model_ids=["a", "b"]) as fake:
        url = f"{fake.base_url}/models"
        async with aiohttp.ClientSession() as session:
            missing = await session.get(url)
            assert missing.status == 401
            assert (await missing.json())["error"]["code"] == "invalid_api_key"
            wrong = await session.get(url, headers={"Authorization": "Bearer nope"})
            assert wrong.status == 401
            chat = await _chat(session, fake.base_url)
            assert chat.status == 401
            assert fake.requests == []
            good = await session.get(url, headers={"Authorization": "Bearer sk-test"})
            assert good.status == 200
            assert [m["id"] for m in (await good.json())["data"]] == ["a", "b"]


async def test_disconnect_mid_hang_does_not_break_server(fake: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake.add(
        Reply(text="partial answer that never ends", hang=True, chunk_size=4),
        "next one",
    )
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True)
        first = await response.content.readuntil(b"\n\n")
        assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
        second = await response.content.readuntil(b"\n\n")
        assert json.loads(second[6:])["choices"][0]["delta"]["content"] == "part"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(response.content.readuntil(b"\n\n"), 0.3)
        response.close()  # the client goes away mid-stream
    async with aiohttp.ClientSession() as session:
        result = _reassemble(await _sse_chunks(await _chat(session, fake.base_url, stream=True)))
        assert result["text"] == "next one"
    await asyncio.sleep(0.2)  # let the hanging handler notice the disconnect
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_disconnect_mid_delay_stream(fake: FakeOpenAI, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake.add(Reply(text="x" * 200, chunk_size=1, delay=0.01), "fine")
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True)
        await response.content.readuntil(b"\n\n")
        response.close()
        await asyncio.sleep(0.1)
        data = await (await _chat(session, fake.base_url)).json()
        assert data["choices"][0]["message"]["content"] == "fine"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_stop_ends_hanging_stream() -> None:
    fake = FakeOpenAI([Reply(text="abc", hang=True)])
    await fake.start()
    async with aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True)
        await response.content.readuntil(b"\n\n")
        await asyncio.wait_for(fake.stop(), 5)
        response.close()


async def test_hang_timeout_is_bounded() -> None:
    fake = FakeOpenAI([Reply(text="abc", hang=True)], hang_timeout=0.2)
    async with fake, aiohttp.ClientSession() as session:
        response = await _chat(session, fake.base_url, stream=True)
        body = await asyncio.wait_for(response.read(), 5)
    assert b"[DONE]" not in body


async def test_app_with_aiohttp_client(aiohttp_client: Any) -> None:
    fake = FakeOpenAI(["via test client"])
    client = await aiohttp_client(fake.app())
    response = await client.post("/v1/chat/completions", json={"model": "m", "messages": [], "stream": False})
    data = await response.json()
    assert data["choices"][0]["message"]["content"] == "via test client"


def test_start_in_thread() -> None:
    fake = FakeOpenAI(["threaded"])
    base_url = fake.start_in_thread()
    try:

        async def go() -> str:
            async with aiohttp.ClientSession() as session:
                waiter = asyncio.create_task(fake.wait_for_requests(1, timeout=5))
                data = await (await _chat(session, base_url)).json()
                await waiter
                return str(data["choices"][0]["message"]["content"])

        assert asyncio.run(go()) == "threaded"
        assert len(fake.requests) == 1
    finally:
        fake.stop_thread()


def _spawn_cli(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_gateway.testing.fake_openai", "--port", "0", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    prefix = "fake-openai listening on "
    assert line.startswith(prefix), (
        line,
        proc.stderr.read() if proc.poll() is not None else "",
    )
    return proc, line[len(prefix) :]


async def test_cli_serves(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                "scripted one",
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a"}}]},
            ]
        )
    )
    proc, base_url = _spawn_cli("--script", str(script), "--model", "local")
    try:
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        async with aiohttp.ClientSession() as session:
            models = await (await session.get(f"{base_url}/models")).json()
            assert [m["id"] for m in models["data"]] == ["local"]
            first = await (await _chat(session, base_url)).json()
            assert first["choices"][0]["message"]["content"] == "scripted one"
            second = await (await _chat(session, base_url, stream=True)).read()
            assert b'"read_file"' in second
            exhausted = await _chat(session, base_url)
            assert exhausted.status == 500
            assert "exhausted" in (await exhausted.json())["error"]["message"]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
        assert proc.returncode == 0


async def test_cli_echo_default() -> None:
    proc, base_url = _spawn_cli("--echo")
    try:
        async with aiohttp.ClientSession() as session:
            data = await (await _chat(session, base_url)).json()
            assert data["choices"][0]["message"]["content"] == "echo: hi"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
