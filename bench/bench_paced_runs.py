"""What runs paced like a model cost the gateway: group commits and CPU per run, against a baseline's.

    python bench/bench_paced_runs.py [--runs 20] [--at-once 1,10] [--deltas 50] [--gap-ms 10]
                                     [--rounds 3] [--baseline-python PATH]

A real `agent-gateway serve` (SQLite, default config) with the chat-only runtime, pointed at
bench_fairness's upstream (its own process), which answers each run with `--deltas` deltas
`--gap-ms` apart, as a model streams its tokens. Each run is one call (`POST /v1/runs` with
`Accept: text/event-stream`) read to its end; `--at-once` runs go together, waves of them until
`--runs`. `--baseline-python`: a Python whose `agent_gateway` is the baseline (another checkout in
its own venv); the rounds alternate between the gateways (the order swapped each round).
`_floor_server.py` runs beside them in the same rounds: a bare aiohttp server relaying the same
answer to the same client (no journal, storage or anything else), the CPU no aiohttp gateway goes
below; the report gives it as a share of each gateway's.

Per run: the journal's group commits (`agent_gateway_journal_commits_total`), the loop thread's
CPU and the worker threads' (`/proc/<pid>/task/*/schedstat`), read once no run is active; the
upstream's own CPU per run beside them. Prints one JSON line per gateway, concurrency and round,
then the medians and this gateway's figures over the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, median
from bench_fairness import _run_body, _runs_ended
from bench_run_cost import process_cpu_ns, thread_cpu, upstream_and_gateways

COMMITS = re.compile(r"^agent_gateway_journal_commits_total (\S+)$", re.M)


async def _commits(http: aiohttp.ClientSession, url: str) -> float:
    """The journal's group commits so far (0 for the floor, which stores nothing)."""
    async with http.get(url + "/metrics") as response:
        found = COMMITS.search(await response.text())
    return float(found.group(1)) if found else 0.0


async def _run(http: aiohttp.ClientSession, url: str, model: str) -> None:
    """One run, created and streamed in one call, read to its end."""
    headers = {"Accept": "text/event-stream"}
    async with http.post(url + "/v1/runs", json=_run_body(model), headers=headers) as response:
        if response.status not in (200, 201):
            raise RuntimeError(f"POST /v1/runs answered {response.status}")
        async for _ in response.content:
            pass


async def _measure(
    http: aiohttp.ClientSession, url: str, pid: int, upstream_pid: int, model: str, runs: int, at_once: int
) -> dict[str, Any]:
    commits_before, before, upstream_before = await _commits(http, url), thread_cpu(pid), process_cpu_ns(upstream_pid)
    for _ in range(max(runs // at_once, 1)):
        await asyncio.gather(*(_run(http, url, model) for _ in range(at_once)))
    await _runs_ended(http, url)
    commits_after, after, upstream_after = await _commits(http, url), thread_cpu(pid), process_cpu_ns(upstream_pid)
    count = max(runs // at_once, 1) * at_once
    loop_ns = after.get(pid, 0) - before.get(pid, 0)
    workers_ns = sum(ns - before.get(tid, 0) for tid, ns in after.items() if tid != pid)
    return {
        "at_once": at_once,
        "runs": count,
        "commits_per_run": (commits_after - commits_before) / count,
        "loop_ms": loop_ns / 1e6 / count,
        "workers_ms": workers_ns / 1e6 / count,
        "total_ms": (loop_ns + workers_ns) / 1e6 / count,
        "upstream_ms": (upstream_after - upstream_before) / 1e6 / count,
    }


async def _bench(
    gateways: dict[str, tuple[str, int]], upstream_pid: int, model: str, runs: int, levels: list[int], rounds: int
) -> None:
    results: dict[tuple[str, int], list[dict[str, Any]]] = {(g, n): [] for g in gateways for n in levels}
    names = list(gateways)
    async with aiohttp.ClientSession(headers={"X-Agent-Gateway-Client": "bench"}) as http:
        for url, _ in gateways.values():  # warm up: imports, connections, caches
            await _run(http, url, model)
        for index in range(rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                url, pid = gateways[name]
                for at_once in levels:
                    result = await _measure(http, url, pid, upstream_pid, model, runs, at_once)
                    results[name, at_once].append(result)
                    line = {"round": index, "gateway": name, **{k: round(v, 3) for k, v in result.items()}}
                    print(json.dumps(line), flush=True)
    report: dict[str, Any] = {"model": model, "runs": runs, "rounds": rounds, "load": load()}
    keys = ("commits_per_run", "loop_ms", "workers_ms", "total_ms", "upstream_ms")
    for (name, at_once), rows in results.items():
        for key in keys:
            report[f"{name}.{at_once}_at_once.{key}"] = round(median([row[key] for row in rows]), 3)
    pairs = [("this", "baseline", keys[:-1]), ("floor", "this", ("total_ms",)), ("floor", "baseline", ("total_ms",))]
    for over, under, compared in pairs:
        if over not in gateways or under not in gateways:
            continue
        for at_once in levels:
            rounds_of = list(zip(results[over, at_once], results[under, at_once], strict=True))
            for key in compared:
                ratios = [this[key] / base[key] for this, base in rounds_of if base[key] > 0]
                report[f"{at_once}_at_once.{key}.{over}_over_{under}"] = round(median(ratios), 3)
    print(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per measurement")
    parser.add_argument("--at-once", default="1,10", help="runs streaming together, comma-separated")
    parser.add_argument("--deltas", type=int, default=50)
    parser.add_argument("--gap-ms", type=int, default=10, help="the upstream's pause between two deltas")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-python", help="a Python whose agent_gateway is the baseline (its own venv)")
    args = parser.parse_args()
    levels = [int(level) for level in args.at_once.split(",")]
    model = f"n{args.deltas}p{args.gap_ms}"
    with upstream_and_gateways(args.baseline_python, model) as (gateways, upstream_pid):
        started = time.perf_counter()
        asyncio.run(_bench(gateways, upstream_pid, model, args.runs, levels, args.rounds))
        print(f"took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
