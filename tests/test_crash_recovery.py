"""A real gateway process is SIGKILLed mid-run and restarted on the same data directory.

The run must come back `interrupted` with exactly one `run.interrupted` event, last; every event a
client saw before the kill must be in the journal under the same seq with the same content (no
seq reused for another event), and a stream resumed with Last-Event-ID must deliver the rest.
The gateway is started as `python -m agent_gateway.cli serve --port 0 --data-dir <tmp>`; the fake
OpenAI upstream runs in the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_gateway.models import TERMINAL_KINDS
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import GatewayProcess, sse_events, start_gateway_process

WAIT = 20.0


@pytest.fixture
async def start_gateway(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[GatewayProcess] = []

    async def start(data_dir: Path, upstream: str) -> GatewayProcess:
        env = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": upstream, "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m"}
        gateway = await start_gateway_process(data_dir, tmp_path / f"gateway-{len(started)}.log", env=env)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        with contextlib.suppress(ProcessLookupError):
            await gateway.stop()


async def test_sigkill_mid_run_then_restart_interrupts_the_run_and_keeps_every_seen_event(
    tmp_path: Path, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    text = "".join(chr(ord("a") + i % 26) for i in range(3000))
    fake_llm.default = Reply(text=text, chunk_size=1, delay=0.01)  # ~30 s: killed long before the end
    data_dir = tmp_path / "data"
    first = await start_gateway(data_dir, fake_llm.base_url)
    seen: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
        response = await http.post(
            f"{first.url}/v1/runs",
            json={"requestId": "crash-1", "agentId": "chat-only", "sessionId": "s-crash", "message": "go"},
        )
        assert response.status == 201, await response.text()
        run_id = (await response.json())["hostRunId"]
        async with asyncio.timeout(WAIT):
            stream = await http.get(f"{first.url}/v1/runs/{run_id}/stream")
            assert stream.status == 200
            deltas = 0
            killed = False
            with contextlib.suppress(aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
                async for event in sse_events(stream):
                    seen.append(event)
                    deltas += event["event"] == "message.delta"
                    if deltas == 40 and not killed:
                        # Kill with the stream open; whatever was already sent is still read.
                        first.kill()
                        await first.wait()
                        killed = True
            stream.release()
        assert killed, [e["event"] for e in seen]
    assert first.proc.returncode == -signal.SIGKILL
    assert not any(e["event"] in TERMINAL_KINDS for e in seen)
    assert [int(e["id"]) for e in seen] == list(range(1, len(seen) + 1))

    fake_llm.default = None  # echo again for the follow-up run
    second = await start_gateway(data_dir, fake_llm.base_url)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
        receipt = await (await http.get(f"{second.url}/v1/runs/{run_id}")).json()
        assert receipt["status"] == "interrupted", receipt

        journal: list[dict[str, Any]] = []
        cursor = "0"
        while True:
            page = await (await http.get(f"{second.url}/v1/runs/{run_id}/events", params={"afterSeq": cursor})).json()
            if not page["events"]:
                break
            journal.extend(page["events"])
            cursor = page["nextCursor"]
        kinds = [e["kind"] for e in journal]
        assert kinds[-1] == "run.interrupted"
        assert sum(k in TERMINAL_KINDS for k in kinds) == 1
        seqs = [int(e["seq"]) for e in journal]
        assert seqs == list(range(1, len(journal) + 1))
        # Every event the client saw is in the journal, same seq, same event.
        by_seq = {e["seq"]: e for e in journal}
        for event in seen:
            assert by_seq.get(event["id"]) == event["data"], event["id"]
        assert len(journal) > len(seen)  # at least the synthetic terminal event

        # Resuming from the last event seen delivers the rest, ending in run.interrupted.
        async with asyncio.timeout(WAIT):
            resumed_response = await http.get(
                f"{second.url}/v1/runs/{run_id}/stream", headers={"Last-Event-ID": seen[-1]["id"]}
            )
            resumed = [e async for e in sse_events(resumed_response)]
        assert [e["data"] for e in resumed] == [e for e in journal if int(e["seq"]) > int(seen[-1]["id"])]
        assert resumed[-1]["event"] == "run.interrupted"

        active = await (await http.get(f"{second.url}/v1/sessions/s-crash/active-run")).json()
        assert active["run"] is None
        # The session goes on: a follow-up run (pointing at the interrupted one) completes.
        follow = await http.post(
            f"{second.url}/v1/runs",
            json={
                "requestId": "crash-2",
                "agentId": "chat-only",
                "sessionId": "s-crash",
                "message": "continue after the crash",
                "parentRunId": run_id,
            },
        )
        assert follow.status == 201, await follow.text()
        follow_receipt = await follow.json()
        assert follow_receipt["parentRunId"] == run_id
        async with asyncio.timeout(WAIT):
            follow_stream = await http.get(f"{second.url}/v1/runs/{follow_receipt['hostRunId']}/stream")
            follow_events = [e async for e in sse_events(follow_stream)]
        assert follow_events[-1]["event"] == "run.completed"
        # The retry of the interrupted run's requestId is still that run, not a new one.
        retry = await http.post(
            f"{second.url}/v1/runs",
            json={"requestId": "crash-1", "agentId": "chat-only", "sessionId": "s-crash", "message": "go"},
        )
        assert retry.status == 200
        assert (await retry.json())["hostRunId"] == run_id
    await second.stop()
    assert second.proc.returncode == 0, second.log()


async def test_a_run_killed_before_its_row_was_stored_comes_back_from_the_spool(
    tmp_path: Path, fake_llm: FakeOpenAI, start_gateway: Any
) -> None:
    """A new run's row goes to storage behind its first event; the spool holds it until then. With
    SQLite's write lock held elsewhere, the row cannot be stored: the client still gets its receipt
    and `run.created`, the gateway is killed, and the restarted one has the run (interrupted) with
    its request: a retry of its requestId is that run, a different body is a conflict."""
    data_dir = tmp_path / "data"
    first = await start_gateway(data_dir, fake_llm.base_url)
    body = {"requestId": "kept-1", "agentId": "chat-only", "sessionId": "s-kept", "message": "go"}
    blocker = sqlite3.connect(data_dir / "gateway.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # the gateway's writes now wait (busy timeout: 15 s)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
            response = await http.post(f"{first.url}/v1/runs", json=body)
            assert response.status == 201, await response.text()
            receipt = await response.json()
            assert blocker.execute("SELECT count(*) FROM ag_runs").fetchone() == (0,)  # not stored yet
            repeat = await http.post(f"{first.url}/v1/runs", json=body)  # found in memory
            assert repeat.status == 200, await repeat.text()
            assert (await repeat.json())["hostRunId"] == receipt["hostRunId"]
            reused = await http.post(f"{first.url}/v1/runs", json={**body, "message": "another"})
            assert reused.status == 409, await reused.text()
            async with asyncio.timeout(WAIT):
                stream = await http.get(f"{first.url}/v1/runs/{receipt['hostRunId']}/stream")
                first_event = await anext(sse_events(stream))
                stream.release()
        assert first_event["event"] == "run.created"
        first.kill()
        await first.wait()
        assert blocker.execute("SELECT count(*) FROM ag_runs").fetchone() == (0,)
    finally:
        blocker.close()  # rolls back: the lock is free for the next gateway

    second = await start_gateway(data_dir, fake_llm.base_url)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
        got = await http.get(f"{second.url}/v1/runs/{receipt['hostRunId']}")
        assert got.status == 200, await got.text()
        stored = await got.json()
        assert stored["status"] == "interrupted", stored
        assert stored["createdAt"] == receipt["createdAt"]
        page = await (await http.get(f"{second.url}/v1/runs/{receipt['hostRunId']}/events")).json()
        kinds = [e["kind"] for e in page["events"]]
        # What the run had done when the kill came (its status does not wait for storage), then
        # the end the restart gave it: one terminal event, the last.
        assert kinds[0] == "run.created", kinds
        assert [kind for kind in kinds if kind.startswith("run.") and kind not in ("run.created", "run.started")] == [
            "run.interrupted"
        ], kinds
        assert kinds[-1] == "run.interrupted", kinds
        assert page["events"][0]["payload"]["receipt"]["hostRunId"] == receipt["hostRunId"]
        retry = await http.post(f"{second.url}/v1/runs", json=body)
        assert retry.status == 200, await retry.text()
        assert (await retry.json())["hostRunId"] == receipt["hostRunId"]
        conflict = await http.post(f"{second.url}/v1/runs", json={**body, "message": "another"})
        assert conflict.status == 409, await conflict.text()
    await second.stop()
