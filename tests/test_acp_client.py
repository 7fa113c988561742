"""Tests for the ACP client transport (agent_gateway.acp) against the fake ACP agents as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.acp import (
    AcpProcess,
    AcpProcessExited,
    AcpRemoteError,
    AcpRequestError,
    AcpTimeout,
    extract_text,
    map_update,
)
from tests._harness import FAKE_ACP_AGENT

REPO_ROOT = Path(__file__).resolve().parent.parent
WAIT = 20.0  # upper bound for any single wait in these tests

Spawn = Callable[..., Awaitable[AcpProcess]]


def agent_command(behaviour: str, *extra: str) -> list[str]:
    return [sys.executable, FAKE_ACP_AGENT, "--behaviour", behaviour, *extra]


def agent_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("FAKE_ACP_DELAY", None)
    env.pop("FAKE_ACP_STATE_DIR", None)
    env.update(extra)
    return env


class Recorder:
    """Collects (sessionId, update) pairs; lets a test wait for a condition without sleeping."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self._waiters: list[tuple[Callable[[], bool], asyncio.Event]] = []

    def __call__(self, session_id: str, update: dict[str, Any]) -> None:
        self.items.append((session_id, update))
        for predicate, event in self._waiters:
            if predicate():
                event.set()

    @property
    def updates(self) -> list[dict[str, Any]]:
        return [update for _, update in self.items]

    def kinds(self) -> list[str]:
        return [update.get("sessionUpdate", "?") for update in self.updates]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(extract_text(u.get("content")) for u in self.updates if u.get("sessionUpdate") == kind)

    def clear(self) -> None:
        self.items.clear()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = WAIT) -> None:
        if predicate():
            return
        event = asyncio.Event()
        entry = (predicate, event)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        finally:
            self._waiters.remove(entry)


@pytest.fixture
async def spawn() -> AsyncIterator[Spawn]:
    started: list[AcpProcess] = []

    async def _spawn(behaviour: str, *, env: dict[str, str] | None = None, **kwargs: Any) -> AcpProcess:
        proc = AcpProcess(agent_command(behaviour), env=env or agent_env(), cwd=str(REPO_ROOT), **kwargs)
        await proc.start()
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        await proc.close(grace=2.0)


async def _ready(proc: AcpProcess, cwd: str = "/tmp") -> str:
    await proc.initialize(timeout=WAIT)
    return await proc.new_session(cwd, timeout=WAIT)


# ---------------------------------------------------------------------------- basic protocol


async def test_initialize_new_session_and_prompt_stream(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("basic", on_update=rec)
    init = await proc.initialize(timeout=WAIT)
    assert init["protocolVersion"] == 1
    assert init["agentCapabilities"]["loadSession"] is False
    assert proc.agent_capabilities["sessionCapabilities"]["list"] == {}
    assert init["agentInfo"]["name"] == "fake-acp-basic"
    raw = await proc.new_session_raw("/tmp", timeout=WAIT)
    assert raw["configOptions"][0]["id"] == "model"
    sid = raw["sessionId"]

    result = await proc.prompt(sid, "hello world", timeout=WAIT)
    assert result == {"stopReason": "end_turn"}
    # every update of the turn was delivered before prompt() returned
    assert rec.kinds()[0] == "agent_thought_chunk"
    assert set(rec.kinds()[1:]) == {"agent_message_chunk"}
    assert len(rec.kinds()) >= 3
    assert rec.text() == "echo: hello world"
    assert rec.text("agent_thought_chunk") == "thinking about 'hello world'"
    assert {session for session, _ in rec.items} == {sid}


async def test_history_is_kept_per_session(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("basic", on_update=rec)
    sid = await _ready(proc)
    other = await proc.new_session("/tmp", timeout=WAIT)
    for text in ("a", "b"):
        await proc.prompt(sid, [{"type": "text", "text": text}], timeout=WAIT)
    await proc.prompt(other, "zzz", timeout=WAIT)
    rec.clear()
    await proc.prompt(sid, "history?", timeout=WAIT)
    assert rec.text() == "a|b"


async def test_async_update_callback_keeps_order(spawn: Spawn) -> None:
    seen: list[str] = []

    async def on_update(session_id: str, update: dict[str, Any]) -> None:
        text = extract_text(update.get("content"))
        # yield a varying number of times: a reordering dispatcher would shuffle these
        for _ in range(len(seen) % 7):
            await asyncio.sleep(0)
        seen.append(text)

    proc = await spawn("flood", on_update=on_update)
    sid = await _ready(proc)
    result = await proc.prompt(sid, "flood 2000 numbered", timeout=WAIT)
    assert result["stopReason"] == "end_turn"
    assert seen == [f"{i}," for i in range(2000)]


async def test_flood_of_small_updates_all_delivered(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("flood", on_update=rec)
    sid = await _ready(proc)
    result = await proc.prompt(sid, "flood 10000", timeout=60)
    assert result["stopReason"] == "end_turn"
    assert rec.text() == "x" * 10000


@pytest.mark.parametrize("read_limit", [8 * 1024 * 1024, 64 * 1024])
async def test_five_megabyte_line_passes(spawn: Spawn, read_limit: int) -> None:
    rec = Recorder()
    proc = await spawn("weird", on_update=rec, read_limit=read_limit)
    sid = await _ready(proc)
    result = await proc.prompt(sid, "big", timeout=WAIT)
    assert result["stopReason"] == "end_turn"
    assert len(rec.updates) == 1
    assert rec.text() == "y" * (5 * 1024 * 1024)
    # the connection is still healthy afterwards
    await proc.prompt(sid, "small", timeout=WAIT)


async def test_unknown_update_kind_and_nonstandard_stop_reason(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("weird", on_update=rec)
    sid = await _ready(proc)
    result = await proc.prompt(sid, "anything", timeout=WAIT)
    assert result["stopReason"] == "teapot"
    assert rec.kinds() == ["agent_message_chunk", "teapot_update", "agent_message_chunk"]
    raw = rec.updates[1]
    assert raw == {"sessionUpdate": "teapot_update", "temperature": 97, "spout": ["short", "stout"]}
    assert map_update(raw) == ("agent.update", {"raw": raw})


# ---------------------------------------------------------------------------- stderr


async def test_chatty_stderr_never_blocks_and_is_bounded(spawn: Spawn) -> None:
    proc = await spawn("stderr_flood", stderr_limit=64 * 1024)
    init = await proc.initialize(timeout=WAIT)  # the agent wrote 5 MB to stderr first
    assert init["protocolVersion"] == 1
    sid = await proc.new_session("/tmp", timeout=WAIT)
    assert (await proc.prompt(sid, "still alive?", timeout=WAIT))["stopReason"] == "end_turn"
    tail = proc.stderr_tail()
    assert 0 < len(tail.encode()) <= 64 * 1024
    assert tail.rstrip().endswith("fake agent: stderr flood done")
    assert len(proc.stderr_tail(100).encode()) <= 100


# ---------------------------------------------------------------------------- errors and timeouts


async def test_request_timeout_raises_acp_timeout(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("basic", on_update=rec, env=agent_env(FAKE_ACP_DELAY="30"))
    sid = await _ready(proc)
    started = time.monotonic()
    with pytest.raises(AcpTimeout) as info:
        await proc.prompt(sid, "slow", timeout=0.3)
    assert time.monotonic() - started < 5
    assert info.value.method == "session/prompt"
    assert info.value.seconds == 0.3
    assert "session/prompt" in str(info.value) and "0.3" in str(info.value)
    assert isinstance(info.value, TimeoutError)
    # the transport is still usable; a queued prompt then gets cancelled promptly
    assert (await proc.list_sessions(timeout=WAIT))["sessions"][0]["sessionId"] == sid


async def test_remote_error_carries_agent_message(spawn: Spawn) -> None:
    proc = await spawn("replay", env=agent_env())
    await proc.initialize(timeout=WAIT)
    with pytest.raises(AcpRemoteError) as info:
        await proc.load_session("does-not-exist", "/tmp", timeout=WAIT)
    assert info.value.code == -32002
    assert info.value.message == "Resource not found"
    assert info.value.data == {"uri": "does-not-exist"}
    assert info.value.method == "session/load"

    basic = await spawn("basic")
    await basic.initialize(timeout=WAIT)
    with pytest.raises(AcpRemoteError) as info:
        await basic.load_session("x", "/tmp", timeout=WAIT)
    assert info.value.code == -32601


async def test_process_exit_fails_pending_requests(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("crash", on_update=rec)
    sid = await _ready(proc)
    with pytest.raises(AcpProcessExited) as info:
        await proc.prompt(sid, "go", timeout=WAIT)
    assert info.value.returncode == 3
    assert "simulated crash" in info.value.stderr_tail
    assert "exited with code 3" in str(info.value)
    assert rec.text() == "about to crash"  # what it wrote before dying was delivered
    assert await proc.wait_closed(timeout=WAIT) == 3
    assert proc.returncode == 3
    assert proc.closed
    with pytest.raises(AcpProcessExited):
        await proc.new_session("/tmp", timeout=WAIT)
    await proc.cancel(sid)  # a no-op on a dead agent


async def test_reader_survives_garbage_and_failing_callbacks(tmp_path: Path) -> None:
    # A hand-written agent: noise on stdout, an answer for an id nobody waits
    # for, then a real answer.
    script = tmp_path / "noisy.py"
    script.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    msg = json.loads(line)\n"
        "    print('this is not json', flush=True)\n"
        "    print('[1, 2]', flush=True)\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'id': 9999, 'result': {}}), flush=True)\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'method': 'session/update',\n"
        "          'params': {'sessionId': 's', 'update': {'sessionUpdate': 'plan', 'entries': []}}}), flush=True)\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'method': 'vendor/ping', 'params': {'n': 1}}), flush=True)\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': {'ok': msg['method']}}), flush=True)\n"
    )
    notes: list[tuple[str, Any]] = []

    def broken(session_id: str, update: dict[str, Any]) -> None:
        raise RuntimeError("callback bug")

    async with AcpProcess(
        [sys.executable, str(script)], on_update=broken, on_notification=lambda m, p: notes.append((m, p))
    ) as proc:
        assert await proc.request("ping", {}, timeout=WAIT) == {"ok": "ping"}
        assert await proc.request("pong", timeout=WAIT) == {"ok": "pong"}
        assert proc.protocol_errors == 6  # 'not json' and two non-object items, twice
        assert notes == [("vendor/ping", {"n": 1})] * 2


async def test_reader_splits_blocks_into_lines_in_order_and_awaits_a_slow_handler(tmp_path: Path) -> None:
    # A hand-written agent: updates in one write, a line split over two writes, blank and CRLF
    # lines, an integer beyond 64 bits (which orjson refuses), then the answer, then a last
    # update with no newline before EOF.
    script = tmp_path / "blocks.py"
    script.write_text(
        "import json, os, sys\n"
        "def upd(i, **extra):\n"
        "    u = {'sessionUpdate': 'agent_message_chunk', 'content': {'type': 'text', 'text': f'{i},'}, **extra}\n"
        "    return json.dumps({'jsonrpc': '2.0', 'method': 'session/update',\n"
        "                       'params': {'sessionId': 's', 'update': u}}).encode()\n"
        "msg = json.loads(sys.stdin.readline())\n"
        "out = sys.stdout.fileno()\n"
        "os.write(out, b'\\n'.join(upd(i) for i in range(500)) + b'\\n\\n  \\r\\n')\n"
        "half = upd(500)\n"
        "os.write(out, half[:40])\n"
        "sys.stdin.readline()\n"  # the test's go-ahead: the rest of the line comes in a later read
        "os.write(out, half[40:] + b'\\r\\n' + upd(501, big=2**70) + b'\\n')\n"
        "os.write(out, json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': {'n': 502}}).encode() + b'\\n')\n"
        "os.write(out, upd(502))\n"
    )
    seen: list[str] = []
    bigs: list[int] = []
    answered_before: list[bool] = []  # per update: had the answer been read when it was handled
    answer: asyncio.Future[Any] | None = None
    first_half = asyncio.Event()

    async def slow_handler(session_id: str, update: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a handler that awaits: the next line waits for it
        seen.append(update["content"]["text"])
        answered_before.append(answer is not None and answer.done())
        if "big" in update:
            bigs.append(update["big"])
        if len(seen) == 500:
            first_half.set()

    async with AcpProcess([sys.executable, str(script)], on_update=slow_handler) as proc:
        answer = asyncio.ensure_future(proc.request("go", {}, timeout=WAIT))
        async with asyncio.timeout(WAIT):
            await first_half.wait()
        assert proc._proc is not None and proc._proc.stdin is not None
        proc._proc.stdin.write(b"\n")
        assert await answer == {"n": 502}
        # Every update written before the answer was handled before it, in order (the reader may
        # already be on the last line by the time this task runs again).
        assert seen[:502] == [f"{i}," for i in range(502)]
        assert answered_before[:502] == [False] * 502
        assert bigs == [2**70]
        assert await proc.wait_closed(timeout=WAIT) == 0
    assert seen == [f"{i}," for i in range(503)]  # the last line, cut short by EOF, still counts
    assert answered_before[502] is True
    assert proc.protocol_errors == 0


# ---------------------------------------------------------------------------- sessions


async def test_load_replays_history_from_state_dir(spawn: Spawn, tmp_path: Path) -> None:
    env = agent_env(FAKE_ACP_STATE_DIR=str(tmp_path))
    first = await spawn("replay", env=env)
    init = await first.initialize(timeout=WAIT)
    assert init["agentCapabilities"]["loadSession"] is True
    sid = await first.new_session("/tmp", timeout=WAIT)
    await first.prompt(sid, "one", timeout=WAIT)
    await first.prompt(sid, "two", timeout=WAIT)
    assert await first.close() == 0
    assert (tmp_path / f"{sid}.json").exists()

    rec = Recorder()
    second = await spawn("replay", env=env, on_update=rec)
    await second.initialize(timeout=WAIT)
    await second.load_session(sid, "/tmp", timeout=WAIT)
    # the replay arrived, in order, before load_session returned
    assert [(u["sessionUpdate"], extract_text(u["content"])) for u in rec.updates] == [
        ("user_message_chunk", "one"),
        ("agent_message_chunk", "echo: one"),
        ("user_message_chunk", "two"),
        ("agent_message_chunk", "echo: two"),
    ]
    assert [map_update(u)[0] for u in rec.updates] == ["user.message.delta", "message.delta"] * 2
    rec.clear()
    await second.prompt(sid, "history?", timeout=WAIT)
    assert rec.text() == "one|two"


async def test_silent_load_and_refusal(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("silent_load", on_update=rec)
    await proc.initialize(timeout=WAIT)
    assert await proc.load_session("unknown-id", "/tmp", timeout=WAIT) == {}
    assert rec.updates == []
    result = await proc.prompt("unknown-id", "hello", timeout=WAIT)
    assert result["stopReason"] == "refusal"


async def test_session_wrappers(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("basic", on_update=rec)
    sid = await _ready(proc, cwd="/work")
    listed = await proc.list_sessions(timeout=WAIT)
    assert [s["sessionId"] for s in listed["sessions"]] == [sid]
    assert (await proc.list_sessions(cwd="/elsewhere", timeout=WAIT))["sessions"] == []
    assert await proc.resume_session(sid, "/work", timeout=WAIT) == {}
    changed = await proc.set_config_option(sid, "model", "fake-large", timeout=WAIT)
    assert changed["configOptions"][0]["currentValue"] == "fake-large"
    with pytest.raises(AcpRemoteError) as info:
        await proc.set_config_option(sid, "model", "nope", timeout=WAIT)
    assert info.value.code == -32602
    assert await proc.set_mode(sid, "architect", timeout=WAIT) == {}
    assert rec.updates == [{"sessionUpdate": "current_mode_update", "currentModeId": "architect"}]
    assert map_update(rec.updates[0]) == ("mode.updated", {"currentModeId": "architect"})
    assert await proc.close_session(sid, timeout=WAIT) == {}
    assert (await proc.list_sessions(timeout=WAIT))["sessions"] == []


async def test_concurrent_prompt_rejected(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("reject_concurrent", on_update=rec, env=agent_env(FAKE_ACP_DELAY="0.2"))
    sid = await _ready(proc)
    first = asyncio.create_task(proc.prompt(sid, "slow one", timeout=WAIT))
    await rec.wait_for(lambda: "agent_thought_chunk" in rec.kinds())
    with pytest.raises(AcpRemoteError) as info:
        await proc.prompt(sid, "second", timeout=WAIT)
    assert info.value.code == -32600
    assert "already running" in info.value.message
    assert (await first)["stopReason"] == "end_turn"
    assert rec.text() == "echo: slow one"


# ---------------------------------------------------------------------------- cancel


async def test_cancel_ends_inflight_prompt(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("basic", on_update=rec, env=agent_env(FAKE_ACP_DELAY="30"))
    sid = await _ready(proc)
    turn = asyncio.create_task(proc.prompt(sid, "never finishes", timeout=WAIT))
    await rec.wait_for(lambda: "agent_thought_chunk" in rec.kinds())
    started = time.monotonic()
    await proc.cancel(sid)
    result = await turn
    assert result["stopReason"] == "cancelled"
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------------------- permission and fs


@pytest.mark.parametrize("choice", ["allow_once", "reject_once"])
async def test_permission_callback_result_is_the_answer(spawn: Spawn, choice: str) -> None:
    rec = Recorder()
    asked: list[dict[str, Any]] = []

    async def on_permission(params: dict[str, Any]) -> dict[str, Any]:
        asked.append(params)
        return {"outcome": {"outcome": "selected", "optionId": choice}}

    proc = await spawn("permission", on_update=rec, on_permission=on_permission)
    sid = await _ready(proc)
    result = await proc.prompt(sid, "please write", timeout=WAIT)
    assert result["stopReason"] == "end_turn"
    assert [o["optionId"] for o in asked[0]["options"]] == ["allow_once", "reject_once"]
    assert asked[0]["sessionId"] == sid
    assert asked[0]["toolCall"]["toolCallId"] == "call-1"
    assert rec.text() == f"permission: {choice}"
    started, done = (map_update(u) for u in rec.updates[:2])
    assert started[0] == "tool.started"
    assert started[1]["toolCallId"] == "call-1" and started[1]["rawInput"] == {"text": "please write"}
    assert done[0] == "tool.completed"
    assert done[1]["status"] == ("completed" if choice == "allow_once" else "failed")


async def test_cancel_answers_open_permission_with_cancelled(spawn: Spawn) -> None:
    rec = Recorder()
    asked = asyncio.Event()

    async def on_permission(params: dict[str, Any]) -> dict[str, Any]:
        asked.set()
        await asyncio.Event().wait()  # a human who never answers
        raise AssertionError("unreachable")

    proc = await spawn("permission", on_update=rec, on_permission=on_permission)
    sid = await _ready(proc)
    turn = asyncio.create_task(proc.prompt(sid, "please write", timeout=WAIT))
    async with asyncio.timeout(WAIT):
        await asked.wait()
    await proc.cancel(sid)
    result = await turn
    assert result["stopReason"] == "cancelled"
    assert rec.text() == "permission: cancelled"


async def test_permission_without_callback_is_cancelled(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("permission", on_update=rec)
    sid = await _ready(proc)
    assert (await proc.prompt(sid, "x", timeout=WAIT))["stopReason"] == "end_turn"
    assert rec.text() == "permission: cancelled"


async def test_fs_callbacks_and_errors(spawn: Spawn) -> None:
    rec = Recorder()
    written: list[dict[str, Any]] = []

    async def on_read(params: dict[str, Any]) -> dict[str, Any]:
        if params["path"] == "/missing":
            raise AcpRequestError(-32002, "no such file", {"path": params["path"]})
        if params["path"] == "/boom":
            raise RuntimeError("disk on fire")
        return {"content": f"contents of {params['path']}"}

    def on_write(params: dict[str, Any]) -> None:  # a sync handler works too
        written.append(params)

    proc = await spawn("fs", on_update=rec, on_read_text_file=on_read, on_write_text_file=on_write)
    sid = await _ready(proc)

    async def ask(text: str) -> str:
        rec.clear()
        assert (await proc.prompt(sid, text, timeout=WAIT))["stopReason"] == "end_turn"
        return rec.text()

    assert await ask("read /notes/a.md") == "read: contents of /notes/a.md"
    assert await ask("write /notes/b.md new text here") == "wrote: /notes/b.md"
    assert written == [{"sessionId": sid, "path": "/notes/b.md", "content": "new text here"}]
    assert await ask("read /missing") == "fs error: -32002 no such file"
    assert await ask("read /boom") == "fs error: -32603 disk on fire"


async def test_unregistered_agent_request_gets_method_not_found(spawn: Spawn) -> None:
    rec = Recorder()
    proc = await spawn("fs", on_update=rec)  # no fs handlers at all
    init = await proc.initialize(timeout=WAIT)
    assert init["protocolVersion"] == 1
    sid = await proc.new_session("/tmp", timeout=WAIT)
    await proc.prompt(sid, "read /x", timeout=WAIT)
    assert rec.text() == "fs error: -32601 Method not found: fs/read_text_file"


async def test_default_client_capabilities_follow_handlers(tmp_path: Path) -> None:
    script = tmp_path / "echo_params.py"
    script.write_text(
        "import json, sys\n"
        "for line in sys.stdin:\n"
        "    msg = json.loads(line)\n"
        "    if 'id' in msg:\n"
        "        print(json.dumps({'jsonrpc': '2.0', 'id': msg['id'], 'result': msg['params']}), flush=True)\n"
    )

    async def read(params: dict[str, Any]) -> dict[str, Any]:
        return {"content": ""}

    async with AcpProcess([sys.executable, str(script)], on_read_text_file=read) as proc:
        sent = await proc.initialize(timeout=WAIT)
        assert sent["protocolVersion"] == 1
        assert sent["clientCapabilities"] == {"fs": {"readTextFile": True, "writeTextFile": False}, "terminal": False}
        assert sent["clientInfo"]["name"] == "agent-gateway"
        sent = await proc.initialize({"fs": {}}, timeout=WAIT, client_info={"name": "host", "version": "1"})
        assert sent["clientCapabilities"] == {"fs": {}}
        assert sent["clientInfo"] == {"name": "host", "version": "1"}
        sent = await proc.set_config_option("s", "fast", True, timeout=WAIT)
        assert sent == {"sessionId": "s", "configId": "fast", "value": True, "type": "boolean"}
        sent = await proc.prompt("s", [{"type": "image", "data": "AA==", "mimeType": "image/png"}], timeout=WAIT)
        assert sent["prompt"] == [{"type": "image", "data": "AA==", "mimeType": "image/png"}]
        await proc.cancel("s")  # a notification: nothing comes back, nothing breaks
        assert await proc.request("still/there", {"n": 2}, timeout=WAIT) == {"n": 2}


# ---------------------------------------------------------------------------- close


async def test_close_is_graceful(spawn: Spawn) -> None:
    proc = await spawn("basic")
    await _ready(proc)
    started = time.monotonic()
    assert await proc.close(grace=5.0) == 0  # stdin EOF is enough for a well-behaved agent
    assert time.monotonic() - started < 5
    assert await proc.wait_closed(timeout=1) == 0
    with pytest.raises(AcpProcessExited):
        await proc.request("initialize", {}, timeout=1)


async def test_close_kills_a_stubborn_agent_and_fails_pending() -> None:
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)",
    ]
    proc = await AcpProcess(stubborn).start()
    pending = asyncio.create_task(proc.request("initialize", {}, timeout=WAIT))
    await asyncio.sleep(0)  # one loop step: the task registers and writes its request (no timing involved)
    started = time.monotonic()
    returncode = await proc.close(grace=0.3)
    assert time.monotonic() - started < 5
    assert returncode is not None and returncode < 0
    with pytest.raises(AcpProcessExited) as info:
        await pending
    assert info.value.returncode == returncode


# ---------------------------------------------------------------------------- map_update


@pytest.mark.parametrize(
    ("update", "kind", "payload"),
    [
        # Chunks: shaped like every runtime's deltas ({text}), so that consecutive ones merge.
        (
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}},
            "message.delta",
            {"text": "hi"},
        ),
        (
            {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}, "messageId": "m1"},
            "thought.delta",
            {"text": "hmm", "messageId": "m1"},
        ),
        (  # the block's other fields stay, without its text (equal from chunk to chunk)
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "a", "annotations": {"priority": 1}},
                "_meta": {"k": 1},
            },
            "message.delta",
            {"text": "a", "_meta": {"k": 1}, "content": {"type": "text", "annotations": {"priority": 1}}},
        ),
        (  # a non-text block stays whole
            {"sessionUpdate": "user_message_chunk", "content": {"type": "image", "data": "AA==", "mimeType": "x"}},
            "user.message.delta",
            {"content": {"type": "image", "data": "AA==", "mimeType": "x"}, "text": ""},
        ),
        (  # a text block whose text is not a string: kept whole, no text
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": 3}},
            "message.delta",
            {"content": {"type": "text", "text": 3}, "text": ""},
        ),
        (
            {
                "sessionUpdate": "tool_call",
                "toolCallId": "t1",
                "title": "Read",
                "kind": "read",
                "status": "pending",
                "locations": [{"path": "/a"}],
                "rawInput": {"p": 1},
            },
            "tool.started",
            {
                "toolCallId": "t1",
                "title": "Read",
                "kind": "read",
                "status": "pending",
                "locations": [{"path": "/a"}],
                "rawInput": {"p": 1},
            },
        ),
        (
            {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"},
            "tool.updated",
            {"toolCallId": "t1", "status": "in_progress"},
        ),
        (
            {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "content": []},
            "tool.updated",
            {"toolCallId": "t1", "content": []},
        ),
        (
            {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed", "rawOutput": "ok"},
            "tool.completed",
            {"toolCallId": "t1", "status": "completed", "rawOutput": "ok"},
        ),
        (
            {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "failed"},
            "tool.completed",
            {"toolCallId": "t1", "status": "failed"},
        ),
        (
            {"sessionUpdate": "plan", "entries": [{"content": "x", "priority": "high", "status": "pending"}]},
            "plan.updated",
            {"entries": [{"content": "x", "priority": "high", "status": "pending"}]},
        ),
        ({"sessionUpdate": "session_info_update", "title": "T"}, "session.info.updated", {"title": "T"}),
        ({"sessionUpdate": "usage_update", "used": 5, "size": 10}, "usage.updated", {"used": 5, "size": 10}),
        (
            {"sessionUpdate": "available_commands_update", "availableCommands": [{"name": "c", "description": "d"}]},
            "commands.updated",
            {"availableCommands": [{"name": "c", "description": "d"}]},
        ),
        ({"sessionUpdate": "current_mode_update", "currentModeId": "ask"}, "mode.updated", {"currentModeId": "ask"}),
        ({"sessionUpdate": "config_option_update", "configOptions": []}, "config.updated", {"configOptions": []}),
        (
            {"sessionUpdate": "plan_removed", "planId": "p"},
            "agent.update",
            {"raw": {"sessionUpdate": "plan_removed", "planId": "p"}},
        ),
        ({"no": "kind"}, "agent.update", {"raw": {"no": "kind"}}),
        ({"sessionUpdate": 7}, "agent.update", {"raw": {"sessionUpdate": 7}}),
    ],
)
def test_map_update(update: dict[str, Any], kind: str, payload: dict[str, Any]) -> None:
    before = repr(update)
    assert map_update(update) == (kind, payload)
    assert repr(update) == before  # pure: input untouched


def test_map_update_non_dict_and_text_lists() -> None:
    assert map_update(None) == ("agent.update", {"raw": None})  # type: ignore[arg-type]
    chunk = {
        "sessionUpdate": "agent_message_chunk",
        "content": [
            {"type": "text", "text": "a"},
            {"type": "resource_link", "uri": "x"},
            {"type": "text", "text": "b"},
        ],
    }
    assert map_update(chunk)[1]["text"] == "ab"
    assert extract_text({"type": "text", "text": 3}) == ""
