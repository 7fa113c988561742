"""What tracing costs: a long chat-only run's gateway CPU per delta with the otel plugin off and on.

    python bench/bench_otel.py [--deltas 5000] [--runs 4] [--rounds 6]

One fake OpenAI-compatible upstream (its own process) answers every chat request with one long
streamed reply (`--deltas` chunks of 8 characters, usage at the end). Two `agent-gateway serve`
processes (SQLite, default config) point at it: one with `[otel] enabled = false`, one with
`enabled = true` and `OTEL_TRACES_EXPORTER=none` / `OTEL_METRICS_EXPORTER=none` (spans and
metrics are made and ended, and dropped: the SDK's own cost without a network exporter's).
Rounds alternate between the two (interleaved, so both see the same machine load); each runs
`--runs` runs one after the other, each streamed to its terminal event by one SSE client, and
reads the gateway process's CPU (its threads', /proc) before and after, once no run is active.
The upstream's own rate, read directly by the same kind of client, is printed beside the
gateway's. The plugin does nothing per delta (spans per run, model call and tool call only), so
the difference is the per-run cost spread over the run's deltas: the budget is at most 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, ROOT, load, median
from bench_fairness import _runs_ended

CHUNK = 8  # characters per streamed delta (the fake upstream's default chunk size)
TERMINAL_LINES = frozenset(f"event: run.{s}".encode() for s in ("completed", "failed", "cancelled", "interrupted"))


def process_cpu(pid: int) -> float:
    """CPU seconds of a process's live threads so far, from the kernel's per-thread accounting
    (nanoseconds, `/proc/<pid>/task/*/schedstat`: /proc/<pid>/stat counts in 10 ms ticks)."""
    total = 0
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{name}/schedstat").read_text().split()[0])
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue
    return total / 1e9


async def _stream_run(http: aiohttp.ClientSession, url: str) -> int:
    """One chat-only run to its terminal event: how many message deltas it streamed."""
    body = {
        "requestId": "bench-" + uuid.uuid4().hex[:12],
        "agentId": "chat-only",
        "sessionId": "s-" + uuid.uuid4().hex[:12],  # a new session: no growing transcript
        "workspaceId": "local:bench",
        "message": "stream a long answer",
    }
    async with http.post(url + "/v1/runs", json=body) as created:
        created.raise_for_status()
        run_id = (await created.json())["hostRunId"]
    deltas = 0
    async with http.get(f"{url}/v1/runs/{run_id}/stream") as stream:
        async for raw in stream.content:
            line = raw.strip()
            if line == b"event: message.delta":
                deltas += 1
            elif line in TERMINAL_LINES:
                if line != b"event: run.completed":
                    raise RuntimeError(f"run {run_id} ended {line.decode()}")
                break
    return deltas


async def _measure(http: aiohttp.ClientSession, url: str, pid: int, runs: int) -> dict[str, Any]:
    before = process_cpu(pid)
    started = time.perf_counter()
    deltas = 0
    for _ in range(runs):
        deltas += await _stream_run(http, url)
    elapsed = time.perf_counter() - started
    await _runs_ended(http, url)
    cpu = process_cpu(pid) - before
    return {"deltas": deltas, "cpu_us_per_delta": 1e6 * cpu / deltas, "deltas_per_s": deltas / elapsed}


async def _upstream_rate(http: aiohttp.ClientSession, base_url: str) -> float:
    """Deltas per second the upstream streams to a client reading it directly."""
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True}
    started = time.perf_counter()
    deltas = 0
    async with http.post(base_url + "/chat/completions", json=body) as response:
        async for raw in response.content:
            if raw.startswith(b"data: {") and b'"content"' in raw:
                deltas += 1
    return deltas / (time.perf_counter() - started)


async def _bench(urls: dict[str, str], pids: dict[str, int], upstream: str, runs: int, rounds: int) -> None:
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in urls}
    upstream_rates: list[float] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, headers={"X-Agent-Gateway-Client": "bench"}) as http:
        for mode, url in urls.items():  # warm up: imports, connections, caches
            await _measure(http, url, pids[mode], 1)
        for index in range(rounds):
            upstream_rates.append(await _upstream_rate(http, upstream))
            order = list(urls) if index % 2 == 0 else list(reversed(urls))  # interleaved
            for mode in order:
                result = await _measure(http, urls[mode], pids[mode], runs)
                results[mode].append(result)
                shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
                print(json.dumps({"round": index, "otel": mode, **shown}), flush=True)
    off = median([r["cpu_us_per_delta"] for r in results["off"]])
    on = median([r["cpu_us_per_delta"] for r in results["on"]])
    report = {
        "runs": runs,
        "rounds": rounds,
        "load": load(),
        "upstream_deltas_per_s": round(median(upstream_rates)),
        "gateway_off_deltas_per_s": round(median([r["deltas_per_s"] for r in results["off"]])),
        "gateway_on_deltas_per_s": round(median([r["deltas_per_s"] for r in results["on"]])),
        "off_cpu_us_per_delta": round(off, 3),
        "on_cpu_us_per_delta": round(on, 3),
        "on_over_off_percent": round(100 * (on / off - 1), 2),
        "budget_percent": 5,
    }
    print(json.dumps(report, indent=1))


def _start_gateway(data_dir: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "agent_gateway", "serve", "--port", "0", "--data-dir", data_dir]
    gateway = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
    assert gateway.stdout is not None
    found = re.search(r"listening on (\S+)", gateway.stdout.readline())
    if not found:
        gateway.kill()
        raise RuntimeError("the gateway did not start")
    return gateway, found.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=5000, help="deltas per run")
    parser.add_argument("--runs", type=int, default=4, help="runs per round and mode")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    text = "x" * (CHUNK * args.deltas)
    fake = [sys.executable, "-m", "agent_gateway.testing.fake_openai", "--port", "0", "--default", text]
    upstream = subprocess.Popen(fake, stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    processes: list[subprocess.Popen[str]] = []
    try:
        assert upstream.stdout is not None
        found = re.search(r"listening on (\S+)", upstream.stdout.readline())
        if not found:
            raise RuntimeError("the fake upstream did not start")
        base_url = found.group(1).rstrip("/")
        base_url = base_url if base_url.endswith("/v1") else base_url + "/v1"
        common = {**ENV, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "", "OPENAI_MODEL": "m"}
        modes = {
            "off": {**common, "AGENT_GATEWAY__OTEL__ENABLED": "false"},
            "on": {
                **common,
                "AGENT_GATEWAY__OTEL__ENABLED": "true",
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_METRICS_EXPORTER": "none",
            },
        }
        with tempfile.TemporaryDirectory() as off_dir, tempfile.TemporaryDirectory() as on_dir:
            urls, pids = {}, {}
            for (mode, env), data_dir in zip(modes.items(), (off_dir, on_dir), strict=True):
                gateway, url = _start_gateway(data_dir, env)
                processes.append(gateway)
                urls[mode], pids[mode] = url, gateway.pid
            started = time.perf_counter()
            asyncio.run(_bench(urls, pids, base_url, args.runs, args.rounds))
            print(f"took {time.perf_counter() - started:.0f} s")
    finally:
        for process in [*processes, upstream]:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
