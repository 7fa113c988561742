"""The client snippet of docs/openai-compatible.md works: run as written (the official ``openai``
SDK, synchronous) against a real gateway, its URL swapped in."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

from aiohttp.test_utils import TestClient

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, MakeGateway

DOC = Path(__file__).resolve().parent.parent / "docs" / "openai-compatible.md"
DOC_URL = "http://127.0.0.1:8787/v1"
DOC_TOKEN = "my-gateway-token"


def snippet() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) == 1, "the page shows one client block"
    return str(blocks[0])


async def test_the_documented_client_runs_against_the_gateway(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> None:
    client: TestClient = await make_gateway(tokens={DOC_TOKEN: "docs"})
    fake_llm.add(Reply(text="Hello!"), Reply(text="Hello again!"), Reply(text="Notes: " + "word " * 40, chunk_size=5))
    code = snippet()
    assert DOC_URL in code and DOC_TOKEN in code
    code = code.replace(DOC_URL, str(client.make_url("/v1")))
    printed = io.StringIO()

    def run() -> None:  # the synchronous SDK, off the event loop that serves the gateway
        with contextlib.redirect_stdout(printed):
            exec(compile(code, str(DOC), "exec"), {})

    async with asyncio.timeout(WAIT):
        await asyncio.to_thread(run)
    lines = printed.getvalue()
    # The resumed stream lost nothing and repeated nothing.
    assert lines == "Hello!\nHello again!\nNotes: " + "word " * 40 + "\ncompleted\n"
