"""The real Pi (`pi --mode rpc`, @earendil-works/pi-coding-agent 1.x) behind the gateway's HTTP API.

Pi is the binary `contrib/peers/install.sh` installs (`PI_BIN`, else
`${AGENT_GATEWAY_PEERS_DIR:-~/.cache/agent-gateway/peers}/bin/pi`); it talks to the contrib fake
OpenAI server. A missing binary is a failure, not a skip.

Checked: a turn streams text and stores the Pi session in the gateway session (never Pi's global
directories); cancel mid-stream sends `abort` and ends the run `cancelled` with the binding kept;
a second turn continues the same Pi session (`native_live`, the LLM sees turn 1) and, after a
gateway restart, the session is resumed from its file (`loaded`); a model call to a tool outside
the gateway's surface fails inside Pi ("Tool bash not found") and the run still ends; Pi's
automatic retries do not end the run early; steer and follow-up reach a running turn; the
gateway's workspace tools work through MCP and change the file on disk, with receipts.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.plugins.pi_lab.runtime import PiRuntime, _migrate_sessions, acp_to_pi_mcp
from agent_gateway.sandbox import bubblewrap
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import MakeGateway, gateway_of, run_to_end, sse_events
from tests._pi_lab import _extra_plugins, body, pi_overrides, start

pytestmark = pytest.mark.peers

TURN_TIMEOUT = 60.0
LONG_REPLY = Reply(text="".join(f"w{i:03d} " for i in range(400)), chunk_size=5, delay=0.05)


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""


def all_text(body: dict[str, Any]) -> str:
    out = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            out.extend(p.get("text", "") for p in content if isinstance(p, dict))
        elif content:
            out.append(str(content))
    return "\n".join(out)


@pytest.fixture
def pi_home(tmp_path: Path) -> Path:
    home = tmp_path / "pi-home"
    home.mkdir()
    return home


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["data"]["payload"]["text"] for e in events if e["event"] == "message.delta")


def session_mode(events: list[dict[str, Any]]) -> str:
    return next(e["data"]["payload"]["sessionMode"] for e in events if e["event"] == "session.info.updated")


async def test_turn_streams_text_and_keeps_pi_session_in_gateway_storage(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path
) -> None:
    fake_llm.add(Reply(text="Hello from the fake model", chunk_size=4))
    client = await start(make_gateway, fake_llm, pi_home)
    gw = gateway_of(client)
    session_id = "s-" + uuid.uuid4().hex[:8]
    receipt, events = await run_to_end(client, body(session_id, "hello pi"), timeout=TURN_TIMEOUT)
    assert events[-1]["event"] == "run.completed", events[-1]
    assert text_of(events) == "Hello from the fake model"
    assert kinds(events).count("message.delta") >= 2, "streamed in pieces, not one blob"
    assert "message.completed" in kinds(events)
    assert session_mode(events) == "new_session"
    # Pi received the message (as a list of parts) and no tools: the surface is the gateway's alone.
    request = fake_llm.requests[-1]
    assert last_user_text(request) == "hello pi"
    assert not any(
        t.get("function", {}).get("name") in ("bash", "read", "edit", "write") for t in request.get("tools") or []
    )
    # The gateway keeps the Pi session's metadata; Pi's files are in the actor's own Pi home.
    record = await asyncio.get_running_loop().run_in_executor(None, gw.storage.get_session, "local", session_id)
    state = record["runtimes"]["pi-lab"]
    assert set(state) >= {"piSessionId", "sessionFile", "model", "allowedRoots"}
    assert state["model"] == "m" and state["allowedRoots"] == []
    home = gw.sandbox.home_for("pi-lab", "local")
    assert Path(state["sessionFile"]).is_file()  # noqa: ASYNC240
    assert Path(state["sessionFile"]).resolve().is_relative_to((home / "sessions").resolve())  # noqa: ASYNC240
    assert (home / "agent" / "models.json").is_file()
    assert (home / "agent" / "mcp.json").is_file()
    if bubblewrap.probe() is None:  # Pi ran confined like every agent
        assert gw.sandbox.confinements["pi-lab"].startswith("bubblewrap:"), gw.sandbox.confinements
    final = await (await client.get(f"/v1/runs/{receipt['hostRunId']}")).json()
    assert final["providerRunId"] == state["piSessionId"]
    assert not (pi_home / ".pi").exists(), "pi used its global directory"


async def test_cancel_mid_stream_aborts_pi_and_keeps_the_session(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path
) -> None:
    fake_llm.add(LONG_REPLY, Reply(text="after the abort"))
    client = await start(make_gateway, fake_llm, pi_home)
    session_id = "s-" + uuid.uuid4().hex[:8]
    created = await (await client.post("/v1/runs", json=body(session_id, "write a lot"))).json()
    run_id = created["hostRunId"]
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(TURN_TIMEOUT):
        async with client.get(f"/v1/runs/{run_id}/stream") as response:
            async for event in sse_events(response):
                events.append(event)
                if event["event"] == "message.delta" and len(events) and kinds(events).count("message.delta") == 3:
                    cancel = await client.post(f"/v1/runs/{run_id}/cancel", json={})
                    assert cancel.status in (200, 202)
    assert events[-1]["event"] == "run.cancelled", kinds(events)[-5:]
    assert len(text_of(events)) < len(LONG_REPLY.text), "the stream was not cut off"
    # The binding survives: the next turn reuses the live Pi session.
    _, events2 = await run_to_end(client, body(session_id, "go on"), timeout=TURN_TIMEOUT)
    assert events2[-1]["event"] == "run.completed"
    assert session_mode(events2) == "native_live"
    assert text_of(events2) == "after the abort"


async def test_hanging_model_is_aborted(make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path) -> None:
    fake_llm.add(Reply(text="stuck", hang=True))
    client = await start(make_gateway, fake_llm, pi_home)
    created = await (await client.post("/v1/runs", json=body("s-" + uuid.uuid4().hex[:8], "hang"))).json()
    run_id = created["hostRunId"]
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(TURN_TIMEOUT):
        async with client.get(f"/v1/runs/{run_id}/stream") as response:
            async for event in sse_events(response):
                events.append(event)
                if event["event"] == "message.delta":
                    await client.post(f"/v1/runs/{run_id}/cancel", json={})
    assert events[-1]["event"] == "run.cancelled"


async def test_second_turn_continues_the_pi_session_live_then_after_restart(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path, tmp_path: Path
) -> None:
    fake_llm.add(Reply(text="The secret word is PAPAYA."), Reply(text="You said PAPAYA."), Reply(text="Still PAPAYA."))
    data_dir = tmp_path / "gw-data"
    client = await start(make_gateway, fake_llm, pi_home, data_dir=data_dir)
    session_id = "s-" + uuid.uuid4().hex[:8]
    r1, e1 = await run_to_end(client, body(session_id, "remember a word"), timeout=TURN_TIMEOUT)
    r2, e2 = await run_to_end(client, body(session_id, "可以"), timeout=TURN_TIMEOUT)
    assert session_mode(e1) == "new_session" and session_mode(e2) == "native_live"
    second = fake_llm.requests[1]
    assert "remember a word" in all_text(second) and "The secret word is PAPAYA." in all_text(second)
    run1 = await (await client.get(f"/v1/runs/{r1['hostRunId']}")).json()
    run2 = await (await client.get(f"/v1/runs/{r2['hostRunId']}")).json()
    assert run1["providerRunId"] == run2["providerRunId"]
    await client.close()

    # A new gateway on the same data: Pi resumes its session file; the LLM gets the whole history.
    client2 = await start(make_gateway, fake_llm, pi_home, data_dir=data_dir)
    r3, e3 = await run_to_end(client2, body(session_id, "and now?"), timeout=TURN_TIMEOUT)
    assert e3[-1]["event"] == "run.completed"
    assert session_mode(e3) == "loaded"
    third = fake_llm.requests[2]
    assert "You said PAPAYA." in all_text(third) and "remember a word" in all_text(third)
    assert "[Earlier turns" not in all_text(third), "loaded sessions are not seeded with a packet"
    run3 = await (await client2.get(f"/v1/runs/{r3['hostRunId']}")).json()
    assert run3["providerRunId"] == run1["providerRunId"]


async def test_lost_session_file_falls_back_to_cold_resume(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "gw-data"
    fake_llm.add(Reply(text="First answer KIWI."), Reply(text="ok"))
    client = await start(make_gateway, fake_llm, pi_home, data_dir=data_dir)
    session_id = "s-" + uuid.uuid4().hex[:8]
    await run_to_end(client, body(session_id, "first"), timeout=TURN_TIMEOUT)
    await client.close()
    for path in (data_dir / "agent-homes" / "pi-lab").rglob("*.jsonl"):
        path.unlink()
    client2 = await start(make_gateway, fake_llm, pi_home, data_dir=data_dir)
    _, events = await run_to_end(client2, body(session_id, "second"), timeout=TURN_TIMEOUT)
    assert session_mode(events) == "cold_resumed"
    assert "First answer KIWI." in all_text(fake_llm.requests[-1])


async def test_tool_outside_the_surface_fails_and_the_run_ends(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path
) -> None:
    fake_llm.add(
        Reply(tool_calls=[{"name": "bash", "arguments": {"command": "cat /etc/passwd"}}]), Reply(text="no shell")
    )
    client = await start(make_gateway, fake_llm, pi_home)
    created, events = await run_to_end(client, body("s-" + uuid.uuid4().hex[:8], "run a command"), timeout=TURN_TIMEOUT)
    assert events[-1]["event"] == "run.completed"
    completed = [e["data"]["payload"] for e in events if e["event"] == "tool.completed"]
    assert completed and completed[0]["tool"] == "bash" and completed[0]["status"] == "failed"
    assert "not found" in completed[0]["result"]
    assert "tool.started" in kinds(events)
    assert text_of(events) == "no shell"
    # The call Pi reported is on the run's audit trail (source agent), its result is not.
    receipts = (await (await client.get(f"/v1/runs/{created['hostRunId']}/receipts")).json())["receipts"]
    assert [(r["source"], r["agentId"], r["tool"], r["status"]) for r in receipts] == [
        ("agent", "pi-lab", "bash", "failed")
    ]
    assert receipts[0]["inputSummary"] == '{"command":"cat /etc/passwd"}'
    assert "not found" not in json.dumps(receipts)


async def test_model_error_fails_with_pis_words(make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path) -> None:
    fake_llm.add(Reply(status=400, error_message="context too spicy"))
    client = await start(make_gateway, fake_llm, pi_home)
    _, events = await run_to_end(client, body("s-" + uuid.uuid4().hex[:8], "hi"), timeout=TURN_TIMEOUT)
    assert events[-1]["event"] == "run.failed"
    assert "context too spicy" in events[-1]["data"]["payload"]["reason"]


async def test_automatic_retry_does_not_end_the_run(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path
) -> None:
    fake_llm.add(Reply(status=500, error_message="flaky upstream"), Reply(text="second try worked"))
    client = await start(make_gateway, fake_llm, pi_home)
    _, events = await run_to_end(client, body("s-" + uuid.uuid4().hex[:8], "hi"), timeout=TURN_TIMEOUT)
    assert events[-1]["event"] == "run.completed", events[-1]
    assert text_of(events) == "second try worked"
    raw_types = [e["data"]["payload"]["raw"].get("type") for e in events if e["event"] == "agent.update"]
    assert "auto_retry_start" in raw_types


async def test_steer_and_follow_up_reach_the_running_turn(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, pi_home: Path
) -> None:
    # Turn 1 is a tool call (the steer is delivered before the next model call), then an answer;
    # the follow-up is taken up when the agent would stop.
    fake_llm.add(
        Reply(tool_calls=[{"name": "bash", "arguments": {"command": "ls"}}], delay=1.0),
        Reply(text="answer after steer"),
        Reply(text="answer to follow-up"),
    )
    client = await start(make_gateway, fake_llm, pi_home)
    runtime = gateway_of(client).runtimes["pi-lab"]
    assert isinstance(runtime, PiRuntime)
    created = await (await client.post("/v1/runs", json=body("s-" + uuid.uuid4().hex[:8], "start"))).json()
    run_id = created["hostRunId"]
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(TURN_TIMEOUT):
        async with client.get(f"/v1/runs/{run_id}/stream") as response:
            async for event in sse_events(response):
                events.append(event)
                if event["event"] == "tool.started":
                    assert (await runtime.steer(run_id, "steer: prefer brevity"))["disposition"] == "queued"
                    assert (await runtime.follow_up(run_id, "and one more thing"))["disposition"] == "queued"
    assert events[-1]["event"] == "run.completed"
    assert "user.steer" in kinds(events) and "user.follow_up" in kinds(events)
    texts = [all_text(r) for r in fake_llm.requests]
    assert len(texts) == 3
    assert "steer: prefer brevity" in texts[1] and "and one more thing" not in texts[1]
    assert "and one more thing" in texts[2]
    assert text_of(events) == "answer after steeranswer to follow-up"
    with pytest.raises(LookupError):
        await runtime.steer(run_id, "too late")


def test_mcp_entries_become_pi_mcp_json_without_secrets_in_the_file() -> None:
    env: dict[str, str] = {}
    name, entry = acp_to_pi_mcp(
        {
            "type": "http",
            "name": "gateway",
            "url": "http://127.0.0.1:1/v1/mcp",
            "headers": [{"name": "Authorization", "value": "Bearer sekrit"}],
        },
        env,
    )
    assert name == "gateway" and entry["url"].endswith("/v1/mcp") and entry["exposure"] == "direct"
    assert "sekrit" not in str(entry) and "Bearer sekrit" in env.values()
    name, entry = acp_to_pi_mcp(
        {"name": "gw", "command": "python3", "args": ["-m", "x"], "env": [{"name": "TOKEN", "value": "t0k"}]}, env
    )
    assert entry["command"] == "python3" and entry["args"] == ["-m", "x"] and "t0k" not in str(entry)
    assert entry["env"]["TOKEN"].startswith("${") and "t0k" in env.values()


@pytest.fixture
async def mcp_gateway(fake_llm: FakeOpenAI) -> Any:
    """A gateway with the MCP surface (wired here where app.py does not wire it yet)."""
    from aiohttp.test_utils import TestServer

    from agent_gateway.app import GATEWAY_KEY, create_app
    from agent_gateway.config import Config
    from agent_gateway.plugin_host import PluginHost

    clients: list[TestClient] = []

    async def factory(overrides: dict[str, dict[str, Any]], data_dir: Path) -> TestClient:
        base = {"gateway": {"data_dir": str(data_dir)}, "chat_only": {"base_url": fake_llm.base_url, "model": "m"}}
        config = Config.load(None, env={}, overrides={**base, **overrides})
        app = create_app(config, PluginHost.load(env={}, extra=_extra_plugins()))
        gw = app[GATEWAY_KEY]
        client = TestClient(TestServer(app))
        await client.start_server()
        if gw.public_url is None:
            gw.set_public_url(str(client.make_url("")))
        clients.append(client)
        return client

    yield factory
    for client in reversed(clients):
        await client.close()


def _mcp_ready() -> bool:
    try:
        import agent_gateway.mcp.wiring  # noqa: F401
    except ImportError:
        return False
    return True


async def test_workspace_tools_through_mcp_change_the_file(
    mcp_gateway: Any, fake_llm: FakeOpenAI, pi_home: Path, tmp_path: Path
) -> None:
    if not _mcp_ready():
        pytest.fail("agent_gateway.mcp.wiring is missing: Pi needs the MCP surface", pytrace=False)
    workspace = tmp_path / "ws"
    (workspace / "notes").mkdir(parents=True)
    page = workspace / "notes" / "today.md"
    page.write_text("alpha\nbeta\n", encoding="utf-8")
    client = await mcp_gateway(
        {**pi_overrides(fake_llm, pi_home), "workspaces": {"roots": {"local:ws": str(workspace)}}}, tmp_path / "gw"
    )
    fake_llm.add(
        Reply(tool_calls=[{"name": "mcp__gateway__workspace_read_file", "arguments": {"path": "notes/today.md"}}]),
        Reply(
            tool_calls=[
                {
                    "name": "mcp__gateway__workspace_patch_file",
                    "arguments": {"path": "notes/today.md", "edits": [{"search": "beta", "replace": "gamma"}]},
                }
            ]
        ),
        Reply(text="patched"),
    )
    _, events = await run_to_end(
        client,
        body("s-" + uuid.uuid4().hex[:8], "fix the page", workspace="local:ws", context={"allowedRoots": ["notes/"]}),
        timeout=TURN_TIMEOUT,
    )
    declared = [t.get("function", {}).get("name") for t in fake_llm.requests[0].get("tools") or []]
    assert any("workspace" in (n or "") for n in declared), declared
    assert events[-1]["event"] == "run.completed", events[-1]
    assert page.read_text(encoding="utf-8") == "alpha\ngamma\n"
    facade = [e for e in events if e["event"] == "tool.completed" and e["data"]["source"] == "tool"]
    assert [e["data"]["payload"]["tool"] for e in facade] == ["workspace.read_file", "workspace.patch_file"]
    assert all(e["data"]["payload"]["receiptId"] for e in facade)
    assert any(e["event"] == "tool.completed" and e["data"]["source"] == "pi-lab" for e in events)
    assert set(kinds(events)) & TERMINAL_KINDS == {"run.completed"}
    # The patch is on this run's own stream (before its end) with the facade call's receipt, and on
    # the workspace stream.
    patch_receipt = facade[1]["data"]["payload"]["receiptId"]
    own = [c for e in events if e["event"] == "files.changed" for c in e["data"]["payload"]["changes"]]
    assert [(c["path"], c["cause"], c["receiptId"]) for c in own] == [("notes/today.md", "tool", patch_receipt)]
    async with asyncio.timeout(TURN_TIMEOUT), client.get("/v1/workspaces/local:ws/events") as response:
        async for event in sse_events(response):
            changes = event["data"]["payload"]["changes"] if event["event"] == "files.changed" else []
            if any(c["path"] == "notes/today.md" for c in changes):
                change = next(c for c in changes if c["path"] == "notes/today.md")
                assert {k: change.get(k) for k in ("path", "change", "cause", "receiptId")} == {
                    "path": "notes/today.md",
                    "change": "modified",
                    "cause": "tool",
                    "receiptId": patch_receipt,
                }
                break


def test_sessions_kept_before_per_actor_homes_move_into_the_actors_home(tmp_path: Path) -> None:
    """A gateway upgraded from the shared layout (`<data_dir>/runtimes/pi/sessions/<ws>/<actor>`)
    finds each actor's Pi sessions in that actor's home, and the stored session file with them."""
    legacy = tmp_path / "runtimes" / "pi" / "sessions" / "ws-1" / "alice-1"
    legacy.mkdir(parents=True)
    (legacy / "2026_abc.jsonl").write_text('{"type":"session"}\n', encoding="utf-8")
    session_dir = tmp_path / "agent-homes" / "pi-lab" / "alice" / "sessions" / "ws-1"
    moved = _migrate_sessions(legacy, session_dir, str(legacy / "2026_abc.jsonl"))
    assert moved == str(session_dir / "2026_abc.jsonl")
    assert Path(moved).read_text(encoding="utf-8") == '{"type":"session"}\n'
    assert not legacy.exists()
    # Once moved, nothing changes (and a file stored outside the old folder is left as it is).
    assert _migrate_sessions(legacy, session_dir, moved) == moved
