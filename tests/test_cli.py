"""The `agent-gateway` launcher, driven as users drive it: the real console script in a subprocess.

serve (embedded default: SQLite in the data directory, 127.0.0.1, prints its URL, exits 0 on
SIGTERM), the loopback-only rule without tokens, `serve --demo` (a streamed reply and a command to
try, which is then tried), `plugins`, `runs tail` / `runs send` against a live gateway, and `_tail`
resuming with Last-Event-ID after a dropped connection. Every wait is bounded; nothing sleeps to
synchronise.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agent_gateway.cli import DEMO_REPLY, _tail
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._cli import WAIT, clean_env, run_cli, serve


async def get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}) as response:
        return response.status, await response.json()


# -- serve -----------------------------------------------------------------------------------------


async def test_serve_embedded_default_prints_url_serves_health_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    async with serve("--port", "0", "--data-dir", str(data_dir), env=clean_env(tmp_path), cwd=tmp_path) as gw:
        assert gw.host == "127.0.0.1" and gw.port > 0
        status, health = await get_json(f"{gw.url}/v1/health")
        assert status == 200 and health["status"] == "ok"
        assert "chat-only" in health["agents"]
        assert (data_dir / "gateway.db").is_file(), list(data_dir.iterdir())
        rc = await gw.terminate()
    assert rc == 0, gw.stderr()


async def test_serve_without_data_dir_uses_xdg_data_home(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    async with serve("--port", "0", env=env, cwd=tmp_path) as gw:
        status, _ = await get_json(f"{gw.url}/v1/health")
        assert status == 200
    assert (Path(env["XDG_DATA_HOME"]) / "agent-gateway" / "gateway.db").is_file()


def ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback on this machine")
async def test_serve_on_ipv6_loopback_prints_a_usable_url(tmp_path: Path) -> None:
    """::1 is loopback (allowed without tokens) and the printed URL brackets the address."""
    async with serve(
        "--host", "::1", "--port", "0", "--data-dir", str(tmp_path / "d"), env=clean_env(tmp_path), cwd=tmp_path
    ) as gw:
        assert gw.url == f"http://[::1]:{gw.port}"
        assert (await get_json(f"{gw.url}/v1/health"))[0] == 200


async def test_serve_refuses_non_loopback_without_tokens(tmp_path: Path) -> None:
    rc, out, err = await run_cli("serve", "--host", "0.0.0.0", "--port", "0", env=clean_env(tmp_path), cwd=tmp_path)
    assert rc != 0
    assert "refusing to listen on 0.0.0.0" in err and "tokens" in err, err
    assert "listening on" not in out


async def test_serve_refuses_non_loopback_host_from_config_file(tmp_path: Path) -> None:
    config = tmp_path / "public.toml"
    config.write_text('[gateway]\nhost = "0.0.0.0"\nport = 0\n')
    rc, _, err = await run_cli("serve", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert rc != 0 and "refusing to listen on 0.0.0.0" in err, err


async def test_serve_with_tokens_may_listen_beyond_loopback_and_requires_them(tmp_path: Path) -> None:
    token = "t" * 24
    env = clean_env(tmp_path, AGENT_GATEWAY__AUTH__TOKENS=f'{{ "{token}" = "alice" }}')
    async with serve("--host", "0.0.0.0", "--port", "0", env=env, cwd=tmp_path) as gw:
        assert gw.host == "0.0.0.0"
        base = f"http://127.0.0.1:{gw.port}"
        assert (await get_json(f"{base}/v1/health"))[0] == 200
        assert (await get_json(f"{base}/v1/agents"))[0] == 401
        status, agents = await get_json(f"{base}/v1/agents", {"Authorization": f"Bearer {token}"})
        assert status == 200 and agents["schema"] == "gateway.agent_descriptors.v1"


async def test_serve_rejects_an_invalid_config(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[gateway]\nport = 70000\n")
    rc, out, err = await run_cli("serve", "--config", str(config), env=clean_env(tmp_path), cwd=tmp_path)
    assert rc != 0
    assert f"{config}: gateway.port: must be 0..65535, got 70000" in err
    assert "listening on" not in out


async def test_serve_demo_streams_a_reply_shows_a_command_that_works_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    async with serve("--demo", "--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path) as gw:
        lines = await gw.read_until("Try it yourself")
        lines += [await gw.readline() for _ in range(3)]  # the commands and "Press Ctrl-C"
        text = "\n".join(lines)
        assert "you> " in text
        assert DEMO_REPLY in text, text
        assert "[run.completed]" in text
        commands = [line.strip() for line in lines if line.strip().startswith("agent-gateway runs send")]
        assert commands and f"--url {gw.url}" in commands[0], lines
        # The command we suggest really works against this gateway.
        argv = shlex.split(commands[0])
        rc, out, err = await run_cli(*argv[1:], env=env, cwd=tmp_path)
        assert rc == 0, err
        assert DEMO_REPLY in out and "[run.completed]" in out
        rc = await gw.terminate()
    assert rc == 0, gw.stderr()


# -- plugins ------------------------------------------------------------------------------------------


async def test_plugins_lists_builtins_with_distribution_and_hooks(tmp_path: Path) -> None:
    rc, out, err = await run_cli("plugins", env=clean_env(tmp_path), cwd=tmp_path)
    assert rc == 0, err
    for name, hooks in {
        "core": "authenticate, authentication_enabled, config_sections, register_projections, register_runtimes, "
        "session_strategy",
        "journal_peewee": "storage_backend",
        "chat_only": "config_sections, register_runtimes",
    }.items():
        assert re.search(rf"^{name}\s+agent-gateway \S+\n\s+hooks: {hooks}$", out, re.M), out

    rc, out, err = await run_cli("plugins", "--json", env=clean_env(tmp_path), cwd=tmp_path)
    assert rc == 0, err
    infos = {info["name"]: info for info in json.loads(out)}
    assert {"core", "journal_peewee", "chat_only"} <= set(infos)
    assert all(infos[n]["distribution"] == "agent-gateway" for n in ("core", "journal_peewee", "chat_only"))
    assert "storage_backend" in infos["journal_peewee"]["hooks"]


async def test_plugins_load_plugins_env_never_drops_builtins(tmp_path: Path) -> None:
    everything = clean_env(tmp_path)
    rc, out, err = await run_cli("plugins", "--json", env=everything, cwd=tmp_path)
    assert rc == 0, err
    builtins = [info["name"] for info in json.loads(out) if info["distribution"] == "agent-gateway"]
    env = clean_env(tmp_path, AGENT_GATEWAY_LOAD_PLUGINS="core")  # names no third-party plugin
    rc, out, err = await run_cli("plugins", "--json", env=env, cwd=tmp_path)
    assert rc == 0, err
    assert [info["name"] for info in json.loads(out)] == builtins


# -- runs tail / runs send --------------------------------------------------------------------------


async def test_runs_tail_follows_a_live_run_to_completion(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    text = "streamed through the gateway and tailed in a terminal"
    fake_llm.default = Reply(text, chunk_size=5, delay=0.02)
    env = clean_env(tmp_path, AGENT_GATEWAY__CHAT_ONLY__BASE_URL=fake_llm.base_url)
    async with serve("--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path) as gw:
        body = {"requestId": "r-tail", "agentId": "chat-only", "sessionId": "s-tail", "message": "hi"}
        async with aiohttp.ClientSession() as http, http.post(f"{gw.url}/v1/runs", json=body) as response:
            assert response.status == 201
            run_id = (await response.json())["hostRunId"]
        rc, out, err = await run_cli("runs", "tail", run_id, "--url", gw.url, env=env, cwd=tmp_path)
        assert rc == 0, err
        assert text + "\n" in out and out.rstrip().endswith("[run.completed]"), out  # its own line

        # --raw prints every event as a JSON line, ending with the terminal one.
        rc, out, _ = await run_cli(
            "runs", "tail", run_id, "--raw", env=env | {"AGENT_GATEWAY_URL": gw.url}, cwd=tmp_path
        )
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert rc == 0 and events[0]["kind"] == "run.created" and events[-1]["kind"] == "run.completed"
        assert [int(e["seq"]) for e in events] == list(range(1, len(events) + 1))


async def test_runs_tail_of_unknown_run_fails(tmp_path: Path) -> None:
    async with serve("--port", "0", "--data-dir", str(tmp_path / "data"), env=clean_env(tmp_path), cwd=tmp_path) as gw:
        rc, _, err = await run_cli("runs", "tail", "run_nope", "--url", gw.url, env=clean_env(tmp_path), cwd=tmp_path)
    assert rc == 1 and "404" in err, err


async def test_runs_send_starts_and_follows_a_run(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    env = clean_env(tmp_path, AGENT_GATEWAY__CHAT_ONLY__BASE_URL=fake_llm.base_url)
    async with serve("--port", "0", "--data-dir", str(tmp_path / "data"), env=env, cwd=tmp_path) as gw:
        rc, out, err = await run_cli("runs", "send", "--url", gw.url, "ping from the cli", env=env, cwd=tmp_path)
    assert rc == 0, err
    assert "echo: ping from the cli" in out and "[run.completed]" in out
    assert re.search(r"^run run_\w+$", err, re.M), err


# -- _tail resumes after a dropped connection -----------------------------------------------------------


def sse(seq: int, kind: str, payload: dict[str, Any]) -> bytes:
    cursor = f"{seq:018d}"
    event = {"hostRunId": "run_x", "seq": cursor, "kind": kind, "source": "test", "payload": payload}
    return f"id: {cursor}\nevent: {kind}\ndata: {json.dumps(event)}\n\n".encode()


@pytest.mark.parametrize("drop", ["abort", "clean_eof"])
async def test_tail_resumes_with_last_event_id_after_a_dropped_connection(drop: str) -> None:
    """The first connection dies mid-stream (transport aborted, or a clean end with no terminal
    event); `_tail` reconnects with Last-Event-ID = the last seq it printed and finishes the run
    with no gap and no duplicate."""
    seen: list[str | None] = []

    async def stream(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Last-Event-ID"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if len(seen) == 1:
            await response.write(sse(1, "run.created", {}) + sse(2, "message.delta", {"text": "Hel"}))
            await response.write(sse(3, "message.delta", {"text": "lo"}))
            if drop == "abort":
                assert request.transport is not None
                request.transport.abort()  # the gateway crashed or a proxy cut the connection
                return response
            await response.write_eof()  # closed cleanly, but the run is not over
            return response
        after = int(seen[-1] or 0)
        for seq, kind, payload in [
            (2, "message.delta", {"text": "Hel"}),
            (3, "message.delta", {"text": "lo"}),
            (4, "message.delta", {"text": " world"}),
            (5, "run.completed", {}),
        ]:
            if seq > after:  # replay strictly after the cursor, like the real route
                await response.write(sse(seq, kind, payload))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/runs/{run_id}/stream", stream)
    printed: list[str] = []
    async with TestServer(app) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("")).rstrip("/")
        status = await asyncio.wait_for(_tail(http, url, "run_x", {}, 0, echo=printed.append), WAIT)
    assert status == "completed"
    assert seen == ["0", "3"]
    output = "".join(printed)
    assert output.startswith("Hello\n[connection lost; resuming after 3]\n world"), output
    assert output.endswith("[run.completed]\n")


async def test_tail_gives_up_after_bounded_attempts() -> None:
    """A stream that never reaches a terminal event is not followed forever."""
    calls = 0

    async def stream(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/runs/{run_id}/stream", stream)
    async with TestServer(app) as server, aiohttp.ClientSession() as http:
        url = str(server.make_url("")).rstrip("/")
        with pytest.raises(Exception, match="gave up after 2 reconnects"):
            await asyncio.wait_for(_tail(http, url, "run_x", {}, 0, attempts=2, echo=lambda _: None), WAIT)
    assert calls == 2
