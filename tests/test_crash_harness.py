"""Crash-safety harness: a real gateway process, many concurrent runs, SIGKILLs at random moments.

Each cycle starts `python -m agent_gateway.cli serve --port 0 --data-dir <same dir>`, checks every run of
the earlier cycles, then drives a batch of concurrent runs — chat-only against the fake OpenAI
upstream (slow streamed replies, in this process) and `reasonix` backed by the fake ACP agent
(`contrib.fake_acp_agents --behaviour basic`, slow through FAKE_ACP_DELAY) — with an SSE client
per run recording everything it saw, cancels some, SIGKILLs some agent processes and finally the
gateway itself, each at a moment drawn from a seeded RNG (measured in events seen by the clients,
not in time). After the last kill the gateway restarts once more and every DESIGN §3 invariant
is checked for every run:

- exactly one terminal event per run, and it is the last; no run is left non-terminal;
- the receipt's status agrees with the terminal event (GET receipt vs events page);
- seqs are 1..n, strictly increasing, none reused: what a client saw at a seq before a kill is
  what the journal holds at that seq afterwards, and nothing a client saw is missing;
- a terminal run's journal never changes again; `active-run` is empty for every session;
- a POST whose answer was lost in a kill, retried with its requestId, is the same run or a new one.

Set AG_CRASH_SEED to replay another schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_gateway.models import STATUS_BY_TERMINAL_KIND, TERMINAL_KINDS, TERMINAL_STATUSES
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import (
    FAKE_ACP_AGENT,
    WAIT,
    GatewayProcess,
    children_of,
    kill_pids,
    processes_tagged,
    sse_events,
    start_gateway_process,
)

SEED = int(os.environ.get("AG_CRASH_SEED", "6"))
CYCLES = 4
RUNS_PER_CYCLE = 28
ACP_EVERY = 4  # every 4th run goes to the fake ACP agent
LENGTHS = (12, 45, 150, 360, 900)  # reply lengths: some runs end before a kill, some never


def _reply(body: dict[str, Any]) -> Reply:
    """The fake upstream's answer: as long as the run's message asks (`len=N`)."""
    length = int(re.findall(r"len=(\d+)", json.dumps(body))[-1])
    return Reply(text="".join(chr(ord("a") + i % 26) for i in range(length)), chunk_size=3, delay=0.012)


@dataclass
class Connection:
    after: int
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Tracked:
    body: dict[str, Any]
    run_id: str | None = None
    connections: list[Connection] = field(default_factory=list)
    final_journal: list[dict[str, Any]] | None = None  # once seen terminal


class Harness:
    def __init__(self, tmp_path: Path, upstream: str) -> None:
        self.tmp_path = tmp_path
        self.data_dir = tmp_path / "data"
        self.upstream = upstream
        self.tag = "ag-harness-" + uuid.uuid4().hex[:12]
        self.rng = random.Random(SEED)
        self.runs: list[Tracked] = []
        self.sessions: set[str] = set()
        self.started = 0
        self.stats = {"killed_agents": 0, "cancelled": 0, "retried_posts": 0}
        self.config = tmp_path / "gateway.toml"
        command = ", ".join(f'"{p}"' for p in [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"])
        self.config.write_text(
            "[gateway]\nheartbeat_seconds = 1.0\n\n"
            f"[reasonix]\ncommand = [{command}]\nmax_processes = 16\nidle_seconds = 60.0\n"
            f'env = {{ FAKE_ACP_DELAY = "0.25", AG_HARNESS_TAG = "{self.tag}" }}\n'
        )

    async def start(self) -> GatewayProcess:
        self.started += 1
        env = {"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": self.upstream, "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m"}
        return await start_gateway_process(
            self.data_dir,
            self.tmp_path / f"gateway-{self.started}.log",
            env=env,
            args=["--config", str(self.config), "--log-format", "json"],
        )

    def cleanup_agents(self) -> None:
        kill_pids(processes_tagged(self.tag))

    # -- checks -------------------------------------------------------------------------------------
    async def check_all(self, http: aiohttp.ClientSession, url: str) -> None:
        for tracked in self.runs:
            if tracked.run_id is None:
                continue
            await self.check_run(http, url, tracked)
        for session in sorted(self.sessions):
            active = await (await http.get(f"{url}/v1/sessions/{session}/active-run")).json()
            assert active["run"] is None, f"{session} still has an active run after recovery: {active['run']}"

    async def check_run(self, http: aiohttp.ClientSession, url: str, tracked: Tracked) -> None:
        run_id = tracked.run_id
        response = await http.get(f"{url}/v1/runs/{run_id}")
        assert response.status == 200, await response.text()
        receipt = await response.json()
        assert receipt["status"] in TERMINAL_STATUSES, f"{run_id} left {receipt['status']} after recovery"
        journal: list[dict[str, Any]] = []
        cursor = "0"
        while True:
            page = await (
                await http.get(f"{url}/v1/runs/{run_id}/events", params={"afterSeq": cursor, "limit": "5000"})
            ).json()
            if not page["events"]:
                break
            journal.extend(page["events"])
            cursor = page["nextCursor"]
        kinds = [e["kind"] for e in journal]
        seqs = [int(e["seq"]) for e in journal]
        assert seqs == list(range(1, len(journal) + 1)), f"{run_id}: seqs {seqs}"
        assert kinds[0] == "run.created"
        assert kinds[-1] in TERMINAL_KINDS, f"{run_id}: last event {kinds[-1]}"
        assert sum(k in TERMINAL_KINDS for k in kinds) == 1, f"{run_id}: {kinds}"
        assert STATUS_BY_TERMINAL_KIND[kinds[-1]] == receipt["status"], f"{run_id}: {receipt['status']} vs {kinds[-1]}"
        again = await (await http.get(f"{url}/v1/runs/{run_id}")).json()
        assert again["status"] == receipt["status"]
        # Nothing a client saw is missing or different; within one connection seqs strictly grow.
        by_seq = {int(e["seq"]): e for e in journal}
        for connection in tracked.connections:
            got = [int(e["id"]) for e in connection.events]
            assert got == sorted(set(got)), f"{run_id}: a connection saw seqs out of order: {got}"
            assert all(s > connection.after for s in got)
            if got:  # replay-then-tail: contiguous from the cursor
                assert got == list(range(connection.after + 1, connection.after + 1 + len(got))), got
            for event in connection.events:
                assert by_seq.get(int(event["id"])) == event["data"], f"{run_id}: seq {event['id']} differs"
        if tracked.final_journal is not None:
            assert journal == tracked.final_journal, f"{run_id}: a terminal run's journal changed"
        tracked.final_journal = journal

    # -- one cycle ------------------------------------------------------------------------------------
    async def cycle(self, index: int, http: aiohttp.ClientSession, gateway: GatewayProcess) -> None:
        url = gateway.url
        seen_total = 0
        # Cycle 1 dies while its POSTs are still being answered; the others at a random depth.
        kill_at = self.rng.randint(1, 3) if index == 1 else self.rng.randint(150, 2500)
        agent_kills = sorted(self.rng.sample(range(1, max(kill_at, 3)), k=2))
        kill_now = asyncio.Event()
        agent_kill_now = asyncio.Event()

        def saw(count: int = 1) -> None:
            nonlocal seen_total
            seen_total += count
            if agent_kills and seen_total >= agent_kills[0]:
                agent_kills.pop(0)
                agent_kill_now.set()
            if seen_total >= kill_at:
                kill_now.set()

        async def resume_old(tracked: Tracked) -> None:
            """Resume a run of an earlier cycle from the last event its client saw."""
            last = max((int(e["id"]) for c in tracked.connections for e in c.events), default=0)
            connection = Connection(last)
            tracked.connections.append(connection)
            async with http.get(f"{url}/v1/runs/{tracked.run_id}/stream", headers={"Last-Event-ID": str(last)}) as r:
                async for event in sse_events(r):
                    connection.events.append(event)
            assert connection.events, f"{tracked.run_id}: nothing after {last}"
            assert connection.events[-1]["event"] in TERMINAL_KINDS

        async def drive(tracked: Tracked, cancel_after: int | None) -> None:
            body = tracked.body
            response = await http.post(f"{url}/v1/runs", json=body)
            assert response.status in (200, 201), await response.text()
            tracked.run_id = (await response.json())["hostRunId"]
            connection = Connection(0)
            tracked.connections.append(connection)
            async with http.get(f"{url}/v1/runs/{tracked.run_id}/stream") as stream:
                assert stream.status == 200
                async for event in sse_events(stream):
                    connection.events.append(event)
                    saw()
                    if cancel_after is not None and len(connection.events) == cancel_after:
                        self.stats["cancelled"] += 1
                        await http.post(f"{url}/v1/runs/{tracked.run_id}/cancel", json={})

        # Earlier runs: resume some streams where their clients left off.
        old = [
            t
            for t in self.runs
            if t.run_id is not None and not any(e["event"] in TERMINAL_KINDS for c in t.connections for e in c.events)
        ]
        await asyncio.gather(*(resume_old(t) for t in self.rng.sample(old, k=min(5, len(old)))))
        # Earlier POSTs whose answer the kill swallowed: retry them with the same requestId.
        for tracked in [t for t in self.runs if t.run_id is None]:
            self.stats["retried_posts"] += 1
            response = await http.post(f"{url}/v1/runs", json=tracked.body)
            assert response.status in (200, 201), await response.text()
            tracked.run_id = (await response.json())["hostRunId"]
        batch: list[Tracked] = []
        for i in range(RUNS_PER_CYCLE):
            session = f"s-{index}-{i // 2}"  # two runs per session: the second queues
            self.sessions.add(session)
            agent = "reasonix" if i % ACP_EVERY == 0 else "chat-only"
            body = {
                "requestId": f"req-{index}-{i}",
                "agentId": agent,
                "sessionId": session,
                "workspaceId": "local:harness",
                "message": f"run {index}-{i}: tell me the alphabet, len={self.rng.choice(LENGTHS)}",
            }
            batch.append(Tracked(body))
        self.runs.extend(batch)
        cancels = {i: self.rng.randint(3, 30) for i in self.rng.sample(range(RUNS_PER_CYCLE), k=4)}
        tasks = [asyncio.create_task(drive(t, cancels.get(i))) for i, t in enumerate(batch)]

        async def agent_killer() -> None:
            while True:
                await agent_kill_now.wait()
                agent_kill_now.clear()
                agents = [pid for pid in children_of(gateway.proc.pid) if self.tag.encode() in _environ(pid)]
                if agents:
                    victims = self.rng.sample(agents, k=max(1, len(agents) // 2))
                    self.stats["killed_agents"] += len(victims)
                    kill_pids(victims)

        killer = asyncio.create_task(agent_killer())
        try:
            # The kill moment: when the clients have seen `kill_at` events (bounded; if the batch
            # ends sooner, the gateway is killed idle, which must be just as safe).
            done = asyncio.ensure_future(asyncio.wait(tasks, return_when=asyncio.ALL_COMPLETED))
            trigger = asyncio.ensure_future(kill_now.wait())
            await asyncio.wait({done, trigger}, timeout=WAIT * 2, return_when=asyncio.FIRST_COMPLETED)
            gateway.kill()
            trigger.cancel()
            assert await gateway.wait() == -9
        finally:
            killer.cancel()
            self.cleanup_agents()
        async with asyncio.timeout(WAIT):
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            # A client cut off by the kill sees a connection error; nothing else may go wrong.
            if isinstance(result, BaseException) and not isinstance(
                result, aiohttp.ClientError | ConnectionError | asyncio.IncompleteReadError
            ):
                raise result


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


@pytest.mark.timeout(240)
async def test_random_sigkills_keep_every_journal_invariant(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = _reply
    harness = Harness(tmp_path, fake_llm.base_url)
    timeout = aiohttp.ClientTimeout(total=WAIT * 3, sock_read=WAIT)
    gateway: GatewayProcess | None = None
    try:
        for index in range(CYCLES):
            gateway = await harness.start()
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await harness.check_all(http, gateway.url)
                await harness.cycle(index, http, gateway)
        gateway = await harness.start()
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await harness.check_all(http, gateway.url)
            # Every run of every cycle was checked at least once after its crash.
            assert all(t.run_id is not None and t.final_journal is not None for t in harness.runs)
            statuses = {t.final_journal[-1]["kind"] for t in harness.runs if t.final_journal}
        await gateway.stop()
        assert gateway.proc.returncode == 0, gateway.log()
    finally:
        if gateway is not None:
            with contextlib.suppress(ProcessLookupError):
                await gateway.stop()
        harness.cleanup_agents()
    # The schedule exercised what it is meant to: runs cut off by a kill, and runs that ended.
    assert "run.interrupted" in statuses, statuses
    assert statuses & {"run.completed", "run.cancelled", "run.failed"}, statuses
    assert harness.stats["killed_agents"] > 0, harness.stats
    print("crash harness:", harness.stats, sorted(Counter(t.final_journal[-1]["kind"] for t in harness.runs).items()))
