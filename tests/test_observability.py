"""Observability: GET /metrics is valid Prometheus text whose numbers move as a user expects, and
`agent-gateway serve --log-format json` writes JSON lines that name the run and session.

The metrics are parsed strictly (HELP and TYPE before every sample, `name{labels} value` lines) and
read before and after runs that complete, fail and are cancelled, while a stream is open, and
after an ACP run leaves a live agent binding behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime, AcpSessionStrategy
from agent_gateway.hookspecs import hookimpl
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import (
    FAKE_ACP_AGENT,
    ROOT,
    WAIT,
    MakeGateway,
    ScriptPlugin,
    gateway_of,
    metric,
    parse_prometheus,
    run_body,
    run_to_end,
    script_body,
    sse_events,
    start_gateway_process,
)

ACP_AGENT = "fake-acp"


class FakeAcpPlugin:
    """An ACP runtime for the fake agent's `basic` behaviour (a real subprocess)."""

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"]
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.runtime = AcpRuntime(AcpAgentSpec(ACP_AGENT, "Fake ACP", "fake-acp", command, env=env))
        register(self.runtime)

    @hookimpl
    def session_strategy(self, runtime: Any, config: Any) -> Any:
        return AcpSessionStrategy() if runtime is getattr(self, "runtime", None) else None


async def scrape(client: TestClient) -> dict[str, Any]:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.content_type == "text/plain"
    return parse_prometheus(await response.text())


async def test_metrics_are_prometheus_text_and_move_with_runs_and_streams(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    script, acp = ScriptPlugin(), FakeAcpPlugin()
    client = await make_gateway(extra_plugins=(script, acp))
    gw = gateway_of(client)
    start = await scrape(client)
    assert metric(start, "agent_gateway_runs_created_total") == 0
    for status in ("completed", "failed", "cancelled", "interrupted"):
        assert metric(start, "agent_gateway_runs_finished_total", status=status) == 0
    for status in ("pending", "queued", "running", "awaiting_permission"):
        assert metric(start, "agent_gateway_runs_active", status=status) == 0
    assert metric(start, "agent_gateway_streams_open") == 0
    assert metric(start, "agent_gateway_live_bindings", agent=ACP_AGENT) == 0

    # A completed run: created, finished, appended and delivered move by exactly its events.
    _, events = await run_to_end(client, run_body("tell me something"))
    after_ok = await scrape(client)
    assert metric(after_ok, "agent_gateway_runs_created_total") == 1
    assert metric(after_ok, "agent_gateway_runs_finished_total", status="completed") == 1
    assert metric(after_ok, "agent_gateway_events_appended_total") == len(events)
    assert metric(after_ok, "agent_gateway_events_delivered_total") == len(events)
    assert metric(after_ok, "agent_gateway_streams_open") == 0

    # A failed run (the upstream answers 500).
    fake_llm.add(Reply(status=500, error_message="upstream exploded"))
    _, failed = await run_to_end(client, run_body("this one fails"))
    assert failed[-1]["event"] == "run.failed"
    after_fail = await scrape(client)
    assert metric(after_fail, "agent_gateway_runs_finished_total", status="failed") == 1
    assert metric(after_fail, "agent_gateway_events_appended_total") == len(events) + len(failed)

    # While a stream is open on a running run: one open stream, one running run; then cancelled.
    response = await client.post("/v1/runs", json=script_body("s-open", "req-open", deltas=5, hold="h"))
    run_id = (await response.json())["hostRunId"]
    async with asyncio.timeout(WAIT), client.get(f"/v1/runs/{run_id}/stream") as stream:
        deltas = 0
        async for event in sse_events(stream):
            deltas += event["event"] == "message.delta"
            if deltas == 5:
                break
        during = await scrape(client)
        assert metric(during, "agent_gateway_streams_open") == 1
        assert metric(during, "agent_gateway_runs_active", status="running") == 1
        assert (await client.post(f"/v1/runs/{run_id}/cancel", json={})).status == 202
        tail = [event async for event in sse_events(stream)]
    assert tail[-1]["event"] == "run.cancelled"
    async with asyncio.timeout(WAIT):
        await gw.runs.wait(run_id)
    after_cancel = await scrape(client)
    assert metric(after_cancel, "agent_gateway_streams_open") == 0
    assert metric(after_cancel, "agent_gateway_runs_active", status="running") == 0
    assert metric(after_cancel, "agent_gateway_runs_finished_total", status="cancelled") == 1
    assert metric(after_cancel, "agent_gateway_runs_created_total") == 3

    # An ACP run leaves its agent session live for the next turn.
    _, acp_events = await run_to_end(client, run_body("hello agent", agentId=ACP_AGENT), timeout=WAIT * 2)
    assert acp_events[-1]["event"] == "run.completed"
    after_acp = await scrape(client)
    assert metric(after_acp, "agent_gateway_live_bindings", agent=ACP_AGENT) == 1
    assert metric(after_acp, "agent_gateway_runs_finished_total", status="completed") == 2

    # Storage: everything committed, in at least one group commit, none failed.
    async with asyncio.timeout(WAIT):
        await gw.journal.flush()
    final = await scrape(client)
    assert metric(final, "agent_gateway_journal_pending_events") == 0
    assert metric(final, "agent_gateway_journal_commits_total") >= 1
    assert metric(final, "agent_gateway_journal_commit_errors_total") == 0
    assert metric(final, "agent_gateway_events_appended_total") == gw.journal.appended
    assert metric(final, "agent_gateway_stream_buffered_events") == 0


async def test_large_counters_are_exact(make_gateway: MakeGateway) -> None:
    client = await make_gateway()
    gw = gateway_of(client)
    gw.stream_stats.delivered = 123_456_789  # a long-lived gateway's count
    samples = await scrape(client)
    assert metric(samples, "agent_gateway_events_delivered_total") == 123_456_789
    gw.stream_stats.delivered += 1  # one more event must show
    assert metric(await scrape(client), "agent_gateway_events_delivered_total") == 123_456_790


async def test_json_logs_name_the_run_and_session_of_a_failure(tmp_path: Path, fake_llm: FakeOpenAI) -> None:
    fake_llm.default = Reply(status=500, error_message="upstream exploded")
    log_path = tmp_path / "gateway.log"
    gateway = await start_gateway_process(
        tmp_path / "data",
        log_path,
        env={"AGENT_GATEWAY__CHAT_ONLY__BASE_URL": fake_llm.base_url, "AGENT_GATEWAY__CHAT_ONLY__MODEL": "m"},
        args=["--log-format", "json"],
    )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT)) as http:
            body = run_body("please fail", sessionId="s-logs")
            response = await http.post(f"{gateway.url}/v1/runs", json=body)
            assert response.status == 201, await response.text()
            run_id = (await response.json())["hostRunId"]
            async with http.get(f"{gateway.url}/v1/runs/{run_id}/stream") as stream:
                events = [event async for event in sse_events(stream)]
            assert events[-1]["event"] == "run.failed"
    finally:
        await gateway.stop()  # flushes and closes stderr
    assert gateway.proc.returncode == 0
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = []
    for line in lines:
        record = json.loads(line)  # every stderr line is one JSON object
        assert {"ts", "level", "logger", "message"} <= set(record), record
        assert record["level"] in ("debug", "info", "warning", "error", "critical")
        records.append(record)
    failures = [r for r in records if r.get("hostRunId") == run_id and r["level"] in ("warning", "error")]
    assert failures, f"no warning/error line names {run_id}:\n" + "\n".join(lines[-20:])
    line = failures[-1]
    assert line["sessionId"] == "s-logs"
    assert line["agentId"] == "chat-only"
    assert "failed" in line["message"] and "upstream exploded" in line["message"]
