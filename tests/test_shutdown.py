"""Graceful shutdown of `agent-gateway serve` with clients connected.

SIGTERM: requests that arrive meanwhile get 503 `shutting_down`; the streams end cleanly (a
workspace's at once, an active run's with its terminal event); an active run gets
``shutdown_grace_seconds`` to finish, then ends `interrupted`; the process exits within a few
seconds. After a restart the run has exactly one terminal event and a client resuming with
Last-Event-ID gets no gap and no duplicate. Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._cli import clean_env, serve, write_config
from tests._harness import sse_events

WAIT = 20.0
EXIT_BOUND = 5.0


async def collect(
    http: aiohttp.ClientSession, url: str, started: asyncio.Event, first_delta: asyncio.Event | None = None
) -> list[dict[str, Any]]:
    """Every event of the stream at `url` until the server ends it; `started` is set once the
    response headers are in, `first_delta` at the first `message.delta`. A stream that is cut
    rather than ended raises."""
    events = []
    async with http.get(url) as response:
        assert response.status == 200, await response.text()
        started.set()
        async for event in sse_events(response):
            events.append(event)
            if first_delta is not None and event["event"] == "message.delta":
                first_delta.set()
    return events


async def start_run(http: aiohttp.ClientSession, url: str, request_id: str) -> str:
    body: dict[str, Any] = {"requestId": request_id, "agentId": "chat-only", "sessionId": "s1", "workspaceId": "w1"}
    body["message"] = "hi"
    body["context"] = {"allowedRoots": ["notes"]}  # what the watcher watches while the run is active
    async with http.post(f"{url}/v1/runs", json=body) as response:
        assert response.status == 201, await response.text()
        return str((await response.json())["hostRunId"])


async def test_sigterm_ends_streams_interrupts_the_run_and_exits_promptly(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    notes = workspace / "notes"
    notes.mkdir(parents=True)
    fake = FakeOpenAI(default=Reply("the first words of a long answer", hang=True), hang_timeout=120.0)
    base_url = await fake.start()
    extra = f'[workspaces]\nroots = {{ "w1" = "{workspace}" }}\n[chat_only]\nbase_url = "{base_url}"\nmodel = "m"\n'
    config = write_config(tmp_path, {"shutdown_grace_seconds": 1.0, "heartbeat_seconds": 60.0}, extra)
    args = ("--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "data"))
    env = clean_env(tmp_path)
    timeout = aiohttp.ClientTimeout(total=WAIT)
    try:
        async with serve(*args, env=env, cwd=tmp_path) as gw, aiohttp.ClientSession(timeout=timeout) as http:
            run_id = await start_run(http, gw.url, "r1")
            run_open, workspace_open, first_delta = asyncio.Event(), asyncio.Event(), asyncio.Event()
            run_client = asyncio.create_task(collect(http, f"{gw.url}/v1/runs/{run_id}/stream", run_open, first_delta))
            workspace_client = asyncio.create_task(collect(http, f"{gw.url}/v1/workspaces/w1/events", workspace_open))
            # The run is under way (its first delta streamed through the hanging upstream) ...
            async with asyncio.timeout(WAIT):
                await workspace_open.wait()
                await first_delta.wait()
            (notes / "before.txt").write_text("seen before the restart")

            stopping_at = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            # ... a request arriving while it stops is refused with 503 JSON, not a 500.
            status, error = 0, {}
            for _ in range(200):
                async with http.get(f"{gw.url}/v1/health") as response:
                    status = response.status
                    if status == 503:
                        error = (await response.json())["error"]
                        break
            assert status == 503 and error["code"] == "shutting_down", (status, error)

            workspace_events = await asyncio.wait_for(workspace_client, EXIT_BOUND)  # ended, not cut
            run_events = await asyncio.wait_for(run_client, EXIT_BOUND)
            rc = await asyncio.wait_for(gw.proc.wait(), EXIT_BOUND)
            took = time.monotonic() - stopping_at
        assert rc == 0, gw.stderr()[-3000:]
        assert took < EXIT_BOUND, took
        assert run_events[-1]["event"] == "run.interrupted", [e["event"] for e in run_events]
        assert [int(e["id"]) for e in run_events] == list(range(1, len(run_events) + 1))
        assert any(e["event"] == "message.delta" for e in run_events), [e["event"] for e in run_events]

        # Restart on the same data: the run is interrupted with one terminal event; resuming the
        # run and the workspace streams after what each client got loses and repeats nothing.
        async with serve(*args, env=env, cwd=tmp_path) as gw, aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(f"{gw.url}/v1/runs/{run_id}") as response:
                assert (await response.json())["status"] == "interrupted"
            async with http.get(f"{gw.url}/v1/runs/{run_id}/stream") as response:
                replay = [e async for e in sse_events(response)]
            assert [(e["id"], e["event"]) for e in replay] == [(e["id"], e["event"]) for e in run_events]
            terminals = [e for e in replay if e["event"] in ("run.interrupted", "run.completed", "run.failed")]
            assert len(terminals) == 1, terminals
            async with http.get(
                f"{gw.url}/v1/runs/{run_id}/stream", headers={"Last-Event-ID": run_events[-1]["id"]}
            ) as response:
                assert [e async for e in sse_events(response)] == []

            last_seen = workspace_events[-1]["id"] if workspace_events else "0"
            await start_run(http, gw.url, "r2")  # the watcher watches a workspace while it has a run
            resumed: list[dict[str, Any]] = []

            async def resume_workspace() -> None:
                async with http.get(
                    f"{gw.url}/v1/workspaces/w1/events", headers={"Last-Event-ID": last_seen}
                ) as response:
                    async for event in sse_events(response):
                        resumed.append(event)
                        if "after-" in str(event["data"]):
                            return

            reader = asyncio.create_task(resume_workspace())
            # The watcher starts watching shortly after the run starts: write until it reports one.
            for attempt in range(100):
                (notes / f"after-{attempt}.txt").write_text("written after the restart")
                done, _ = await asyncio.wait([reader], timeout=0.2)
                if done:
                    break
            await asyncio.wait_for(reader, 1.0)
            seqs = [int(e["id"]) for e in workspace_events + resumed]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # no gap, no duplicate
    finally:
        await fake.stop()


async def test_a_run_that_finishes_within_the_grace_completes(tmp_path: Path) -> None:
    fake = FakeOpenAI(default=Reply("a short answer, slowly", chunk_size=4, delay=0.1))
    base_url = await fake.start()
    extra = f'[chat_only]\nbase_url = "{base_url}"\nmodel = "m"\n'
    config = write_config(tmp_path, {"shutdown_grace_seconds": 4.0}, extra)
    args = ("--config", str(config), "--port", "0", "--data-dir", str(tmp_path / "data"))
    timeout = aiohttp.ClientTimeout(total=WAIT)
    try:
        async with (
            serve(*args, env=clean_env(tmp_path), cwd=tmp_path) as gw,
            aiohttp.ClientSession(timeout=timeout) as http,
        ):
            body = {"requestId": "r1", "agentId": "chat-only", "sessionId": "s1", "message": "hi"}
            async with http.post(f"{gw.url}/v1/runs", json=body) as response:
                run_id = (await response.json())["hostRunId"]
            opened, first_delta = asyncio.Event(), asyncio.Event()
            client = asyncio.create_task(collect(http, f"{gw.url}/v1/runs/{run_id}/stream", opened, first_delta))
            async with asyncio.timeout(WAIT):
                await first_delta.wait()  # the run is under way
            gw.proc.send_signal(signal.SIGTERM)
            events = await asyncio.wait_for(client, EXIT_BOUND + 4.0)
            assert await asyncio.wait_for(gw.proc.wait(), EXIT_BOUND + 4.0) == 0
        assert events[-1]["event"] == "run.completed", [e["event"] for e in events]
        assert "".join(e["data"]["payload"].get("text", "") for e in events if e["event"] == "message.delta")
    finally:
        await fake.stop()
