"""What one short run costs the gateway: CPU per run, by thread, against a health probe's.

    python bench/bench_run_cost.py [--runs 500] [--rounds 2]

A real `agent-gateway serve` (SQLite, default config) with the chat-only runtime, pointed at
bench_fairness's upstream (its own process; a 3-delta answer on a connection kept alive).
One client, one thing at a time, in each round:

- health: `GET /v1/health`, `--runs` times (the baseline: a request that does nothing);
- two calls: `POST /v1/runs`, then `GET .../stream` until the first event, `--runs` times;
- one call: `POST /v1/runs` with `Accept: text/event-stream` until the first event.

Each run goes on to its end after its first event; a kind's CPU is read once no run is active
(the gateway's metrics say so) and the session index has them all (a session list waits for
it). CPU comes from the kernel's per-thread accounting (`/proc/<pid>/task/*/schedstat`): the
loop thread (the gateway's main thread) and the worker threads (storage, the journal's writer).
A worker holds the GIL for much of its time, so its CPU is mostly the loop's time too. Prints
one JSON line per kind and round, then the medians, and a run's CPU over a health probe's.
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
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, ROOT, load, median, percentile
from bench_fairness import _first_event, _health, _runs_ended

PACE = 0.005  # seconds between two runs: each goes on to its end meanwhile, as in bench_fairness


def thread_cpu(pid: int) -> dict[int, int]:
    """Nanoseconds on a CPU so far, by thread id."""
    found: dict[int, int] = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(name)] = int(Path(f"/proc/{pid}/task/{name}/schedstat").read_text().split()[0])
        except (OSError, ValueError):  # a worker that ended meanwhile
            continue
    return found


async def _measure(http: aiohttp.ClientSession, url: str, pid: int, kind: str, count: int) -> dict[str, Any]:
    before = thread_cpu(pid)
    latencies: list[float] = []
    for _ in range(count):
        if kind == "health":
            latencies.append(await _health(http, url))
        else:
            latencies.append(await _first_event(http, url, one_call=kind == "one_call"))
            await asyncio.sleep(PACE)  # pacing between runs
    await _runs_ended(http, url)
    async with http.get(url + "/v1/sessions?limit=1") as listed:  # answers once the session index
        await listed.read()  # has every ended run (the indexer's work is the run's too)
    after = thread_cpu(pid)
    loop_ns = after.get(pid, 0) - before.get(pid, 0)
    workers_ns = sum(ns - before.get(tid, 0) for tid, ns in after.items() if tid != pid)
    return {
        "kind": kind,
        "count": count,
        "loop_ms": loop_ns / 1e6 / count,
        "workers_ms": workers_ns / 1e6 / count,
        "total_ms": (loop_ns + workers_ns) / 1e6 / count,
        "latency_p50_ms": percentile(latencies, 50),
    }


async def _bench(url: str, pid: int, runs: int, rounds: int) -> None:
    kinds = ("health", "two_calls", "one_call")
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    async with aiohttp.ClientSession(headers={"X-Agent-Gateway-Client": "bench"}) as http:
        for kind in kinds:  # warm up: imports, connections, caches
            await _measure(http, url, pid, kind, 50)
        for index in range(rounds):
            for kind in kinds:
                result = await _measure(http, url, pid, kind, runs)
                results[kind].append(result)
                print(
                    json.dumps(
                        {"round": index, **{k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}}
                    ),
                    flush=True,
                )
    health = median([r["total_ms"] for r in results["health"]])
    report: dict[str, Any] = {"runs": runs, "rounds": rounds, "load": load(), "health_total_ms": round(health, 3)}
    for kind in kinds[1:]:
        for key in ("loop_ms", "workers_ms", "total_ms", "latency_p50_ms"):
            report[f"{kind}_{key}"] = round(median([r[key] for r in results[kind]]), 3)
        report[f"{kind}_over_health"] = round(report[f"{kind}_total_ms"] / health, 1)
    print(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    fairness = str(Path(__file__).resolve().parent / "bench_fairness.py")
    upstream = subprocess.Popen([sys.executable, fairness, "--upstream"], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert upstream.stdout is not None
        base_url = upstream.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as data_dir:
            env = {**ENV, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "", "OPENAI_MODEL": "n3"}
            command = [sys.executable, "-m", "agent_gateway", "serve", "--port", "0", "--data-dir", data_dir]
            gateway = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env
            )
            try:
                assert gateway.stdout is not None
                found = re.search(r"listening on (\S+)", gateway.stdout.readline())
                if not found:
                    raise RuntimeError("the gateway did not start")
                started = time.perf_counter()
                asyncio.run(_bench(found.group(1), gateway.pid, args.runs, args.rounds))
                print(f"took {time.perf_counter() - started:.0f} s")
            finally:
                gateway.terminate()
                gateway.wait(timeout=30)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


if __name__ == "__main__":
    main()
