"""What one short run costs the gateway: CPU per run, by thread, against a baseline gateway's.

    python bench/bench_run_cost.py [--runs 300] [--rounds 5] [--baseline-python PATH]

A real `agent-gateway serve` (SQLite, default config) with the chat-only runtime, pointed at
bench_fairness's upstream (its own process; a 3-delta answer on a connection kept alive).
`--baseline-python`: a Python whose `agent_gateway` is the baseline (another checkout installed
in its own venv); its gateway runs beside this one, on the same upstream, and the rounds
alternate between the two (the order swapped each round), so both see the same machine.
`_floor_server.py` runs beside them, on the same upstream and in the same rounds: a bare aiohttp
server doing the run's HTTP work (the two requests, the upstream call, the SSE frames) and nothing
else, the CPU below which no aiohttp gateway goes (`floor`); and the same server keeping each run
in SQLite at its end, its row and events in one transaction on the loop (`floor_store`: the least
a gateway that keeps its runs does). The report gives each as a share of each gateway's.
One client, one thing at a time, in each round and for each gateway:

- health: `GET /v1/health`, `--runs` times (a request that does nothing);
- two calls: `POST /v1/runs`, then `GET .../stream` until the first event, `--runs` times;
- one call: `POST /v1/runs` with `Accept: text/event-stream` until the first event.

Each run goes on to its end after its first event; a kind's CPU is read once no run is active
(the gateway's metrics say so) and the session index has them all (a session list waits for
it). CPU comes from the kernel's per-thread accounting (`/proc/<pid>/task/*/schedstat`): the
loop thread (the gateway's main thread) and each worker thread (storage, the journal's writer,
the session indexer), busiest first. A worker holds the GIL for much of its time, so its CPU is
mostly the loop's time too. The upstream's own CPU per run (the fixture) is printed beside it.
Prints one JSON line per gateway, kind and round, then the medians, and this gateway's CPU per
run over the baseline's.
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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, HERE, ROOT, load, median, percentile
from bench_fairness import _first_event, _health, _runs_ended

PACE = 0.005  # seconds between two runs: each goes on to its end meanwhile, as in bench_fairness
KINDS = ("health", "two_calls", "one_call")
WORKERS_SHOWN = 4  # busiest worker threads printed one by one (the rest summed)


def thread_cpu(pid: int) -> dict[int, int]:
    """Nanoseconds on a CPU so far, by thread id."""
    found: dict[int, int] = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(name)] = int(Path(f"/proc/{pid}/task/{name}/schedstat").read_text().split()[0])
        except (OSError, ValueError):  # a worker that ended meanwhile
            continue
    return found


def process_cpu_ns(pid: int) -> int:
    """User and system CPU of a whole process so far, in nanoseconds (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


async def _measure(
    http: aiohttp.ClientSession, url: str, pid: int, upstream_pid: int, kind: str, count: int
) -> dict[str, Any]:
    before, upstream_before = thread_cpu(pid), process_cpu_ns(upstream_pid)
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
    after, upstream_after = thread_cpu(pid), process_cpu_ns(upstream_pid)
    loop_ns = after.get(pid, 0) - before.get(pid, 0)
    by_worker = sorted((ns - before.get(tid, 0) for tid, ns in after.items() if tid != pid), reverse=True)
    workers_ns = sum(by_worker)
    return {
        "kind": kind,
        "count": count,
        "loop_ms": loop_ns / 1e6 / count,
        "workers_ms": workers_ns / 1e6 / count,
        "total_ms": (loop_ns + workers_ns) / 1e6 / count,
        "busiest_workers_ms": [ns / 1e6 / count for ns in by_worker[:WORKERS_SHOWN]],
        "upstream_ms": (upstream_after - upstream_before) / 1e6 / count,
        "latency_p50_ms": percentile(latencies, 50),
    }


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


async def _bench(gateways: dict[str, tuple[str, int]], upstream_pid: int, runs: int, rounds: int) -> None:
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(g, k): [] for g in gateways for k in KINDS}
    names = list(gateways)
    async with aiohttp.ClientSession(headers={"X-Agent-Gateway-Client": "bench"}) as http:
        for url, pid in gateways.values():  # warm up: imports, connections, caches
            for kind in KINDS:
                await _measure(http, url, pid, upstream_pid, kind, 50)
        for index in range(rounds):
            for name in names if index % 2 == 0 else names[::-1]:
                url, pid = gateways[name]
                for kind in KINDS:
                    result = await _measure(http, url, pid, upstream_pid, kind, runs)
                    results[name, kind].append(result)
                    line = {"round": index, "gateway": name, **{k: _rounded(v) for k, v in result.items()}}
                    print(json.dumps(line), flush=True)
    report: dict[str, Any] = {"runs": runs, "rounds": rounds, "load": load()}
    for name in names:
        for kind in KINDS:
            rows = results[name, kind]
            for key in ("loop_ms", "workers_ms", "total_ms", "upstream_ms", "latency_p50_ms"):
                report[f"{name}.{kind}.{key}"] = round(median([r[key] for r in rows]), 3)
            report[f"{name}.{kind}.busiest_workers_ms"] = [
                round(median([r["busiest_workers_ms"][i] for r in rows if len(r["busiest_workers_ms"]) > i]), 3)
                for i in range(min(len(r["busiest_workers_ms"]) for r in rows))
            ]
    pairs = [("this", "baseline")]
    pairs += [(floor, gateway) for floor in ("floor", "floor_store") for gateway in ("this", "baseline")]
    for kind in KINDS[1:]:
        for over, under in pairs:
            if over not in gateways or under not in gateways:
                continue
            for key in ("total_ms", "loop_ms", "workers_ms") if over == "this" else ("total_ms",):
                ratios = [
                    this[key] / base[key]
                    for this, base in zip(results[over, kind], results[under, kind], strict=True)
                    if base[key] > 0
                ]
                report[f"{kind}.{key}.{over}_over_{under}"] = round(median(ratios), 3)
    print(json.dumps(report, indent=1))


def _start_gateway(
    python: str, data_dir: str, env: dict[str, str], cwd: str | Path = ROOT, command: list[str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    command = command or [python, "-m", "agent_gateway", "serve", "--port", "0", "--data-dir", data_dir]
    gateway = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=cwd, env=env)
    assert gateway.stdout is not None
    found = re.search(r"listening on (\S+)", gateway.stdout.readline())
    if not found:
        gateway.kill()
        raise RuntimeError(f"the gateway of {python} did not start")
    return gateway, found.group(1)


@contextmanager
def upstream_and_gateways(
    baseline_python: str | None, model: str, store_floor: bool = False
) -> Iterator[tuple[dict[str, tuple[str, int]], int]]:
    """bench_fairness's upstream (answering `model`), and pointed at it a gateway per Python
    (`this`; `baseline` if given), each on its own data dir, and `_floor_server.py` (`floor`; with
    `store_floor`, also keeping each run in SQLite: `floor_store`), all stopped on leaving: by
    name, each one's URL and process id; the upstream's."""
    fairness = str(HERE / "bench_fairness.py")
    upstream = subprocess.Popen([sys.executable, fairness, "--upstream"], stdout=subprocess.PIPE, text=True, env=ENV)
    pythons = {"this": sys.executable}
    if baseline_python:
        pythons["baseline"] = baseline_python
    try:
        assert upstream.stdout is not None
        base_url = upstream.stdout.readline().strip()
        env = {**ENV, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "", "OPENAI_MODEL": model}
        with ExitStack() as stack:
            gateways: dict[str, tuple[str, int]] = {}
            for name, python in pythons.items():
                data_dir = stack.enter_context(tempfile.TemporaryDirectory())
                # The baseline's own checkout only: not this one on its path (PYTHONPATH), nor as
                # its working directory, whose package metadata (an editable install's) lists this
                # checkout's plugins.
                if name == "this":
                    gateway, url = _start_gateway(python, data_dir, env)
                else:
                    gateway, url = _start_gateway(python, data_dir, {**env, "PYTHONPATH": ""}, cwd=data_dir)
                stack.callback(gateway.wait, timeout=30)
                stack.callback(gateway.terminate)
                gateways[name] = (url, gateway.pid)
            floors = {"floor": []}
            if store_floor:
                floors["floor_store"] = [
                    "--store",
                    str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "runs.db"),
                ]
            for name, options in floors.items():
                floor_server = [sys.executable, str(HERE / "_floor_server.py"), *options]
                floor, url = _start_gateway(sys.executable, "", env, command=floor_server)
                stack.callback(floor.wait, timeout=30)
                stack.callback(floor.terminate)
                gateways[name] = (url, floor.pid)
            yield gateways, upstream.pid
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-python", help="a Python whose agent_gateway is the baseline (its own venv)")
    args = parser.parse_args()
    with upstream_and_gateways(args.baseline_python, "n3", store_floor=True) as (gateways, upstream_pid):
        started = time.perf_counter()
        asyncio.run(_bench(gateways, upstream_pid, args.runs, args.rounds))
        print(f"took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
