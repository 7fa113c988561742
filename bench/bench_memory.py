"""Memory that settles: many chat-only runs of 20,000 deltas, and many idle SSE clients.

    python bench/bench_memory.py [--runs 1000] [--deltas 20000] [--clients 10000] [--tracemalloc]

A gateway served as `agent-gateway serve` serves it (its runner and site; SQLite, default config
but `max_connections`) with the chat-only runtime, pointed at the fairness benchmark's upstream
(its own process, every answer written as fast as the socket takes).

- runs: `--runs` runs one after another, each in a new session and read to its end by one
  create-and-stream client. The gateway's RSS after the first 10 runs is the baseline; the report
  gives RSS every 50 runs and at the end, and the end minus the baseline (goal: within 20 MB);
  then "settled": RSS once the gateway's own trimmer has made its pass after the last run (the
  bench forces nothing; up to 15 s, `passed: false` if no pass came), also minus the baseline
  and minus the same settled level taken after run 10 (a baseline that does not depend on
  whether a sample caught a run's memory before or after a trim); then RSS after a forced
  `gc.collect()` + `malloc_trim(0)`.
  `--gateway-env KEY=VALUE` sets the gateway process's environment (allocator experiments:
  `PYTHONMALLOC=malloc`, `MALLOC_ARENA_MAX=2`, `MALLOC_MMAP_THRESHOLD_=262144`; and
  `BENCH_TRIMMER_BUSY_PASS_EVERY=SECONDS`, the heap trimmer's busy period).
  With `--tracemalloc` the gateway traces allocations (slower, and it costs memory itself: its
  RSS is not the figure) and the report lists the source lines whose memory grew most between
  the baseline and the end.
- clients: one run whose upstream never answers, and `--clients` idle SSE streams of it; the RSS
  they add over the number of clients (goal: 10 KB each); with `--tracemalloc`, what they hold by
  traceback. The file-descriptor limits of the
  gateway and of this process are raised to their hard limits.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, ROOT, load

HEAP_PATH = "/bench/heap"
SETTLED_PATH = "/bench/settled"
SETTLED_WAIT_SECONDS = 15.0  # longer than the trimmer's idle period (5 s): main's trimmer may not pass at all


def _raise_fd_limit() -> int:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# -- the gateway (its own process) -----------------------------------------------------------------
async def _serve(data_dir: str, base_url: str, trace: bool) -> None:
    from agent_gateway.app import GATEWAY_KEY, create_app
    from agent_gateway.cli import tune_gc_for_serving
    from agent_gateway.config import Config
    from agent_gateway.plugin_host import PluginHost
    from agent_gateway.server.http_server import ConnectionLimits, GatewayRunner, GuardedTCPSite

    if trace:
        tracemalloc.start(8)
    overrides: dict[str, dict[str, Any]] = {
        "gateway": {"data_dir": data_dir, "max_connections": 100_000},
        "chat_only": {"base_url": base_url, "model": "n3"},
    }
    config = Config.load(None, env={}, overrides=overrides)
    app = create_app(config, PluginHost.load(env={}))
    marks: dict[str, tracemalloc.Snapshot] = {}

    async def heap(request: web.Request) -> web.Response:
        """`?mark=NAME` keeps a snapshot; `?diff=NAME` lists the lines that grew most since it."""
        gc.collect()
        if "trim" in request.query:  # give freed heap pages back to the system (glibc)
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            return web.json_response({"trimmed": True})
        if not tracemalloc.is_tracing():
            return web.json_response({"tracing": False})
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [
                tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
            ]
        )
        if "mark" in request.query:
            marks[request.query["mark"]] = snapshot
            return web.json_response({"marked": request.query["mark"]})
        # `&by=lineno`: grouped by the allocating line; `&top=N`: how many groups.
        every = snapshot.compare_to(marks[request.query["diff"]], request.query.get("by", "traceback"))
        stats = every[: int(request.query.get("top", "20"))]
        # `&recent=1`: the innermost frames (what allocated), not the outermost (who started it).
        recent = "recent" in request.query

        def frames(traceback: tracemalloc.Traceback) -> list[tracemalloc.Frame]:
            return list(traceback)[-4:] if recent else list(traceback)[:4]

        top = [
            {
                "size_diff_kb": round(stat.size_diff / 1024, 1),
                "count_diff": stat.count_diff,
                "at": [f"{frame.filename.rsplit('/', 2)[-1]}:{frame.lineno}" for frame in frames(stat.traceback)],
            }
            for stat in stats
        ]
        traced, _peak = tracemalloc.get_traced_memory()
        grew_kb = round(sum(stat.size_diff for stat in every) / 1024, 1)
        return web.json_response({"traced_kb": traced // 1024, "grew_kb": grew_kb, "top": top})

    app.router.add_get(HEAP_PATH, heap)

    # When the last run ended, noted before the gateway's trimmer hears of it (first listener).
    trimmer = app[GATEWAY_KEY].heap_trimmer
    busy_pass_every = os.environ.get("BENCH_TRIMMER_BUSY_PASS_EVERY")  # an experiment's override
    if busy_pass_every and hasattr(trimmer, "busy_pass_every"):
        trimmer.busy_pass_every = float(busy_pass_every)
    last_end = [time.monotonic()]

    def note_end(run: Any) -> None:
        if run.is_terminal:
            last_end[0] = time.monotonic()

    app[GATEWAY_KEY].runs.listeners.insert(0, note_end)

    async def settled(request: web.Request) -> web.Response:
        """Until the gateway's own trimmer has made a pass (started after the last run ended, and
        done), at most SETTLED_WAIT_SECONDS; never collects or trims itself."""
        started = time.monotonic()
        passed = False
        while not passed and time.monotonic() - started < SETTLED_WAIT_SECONDS:
            last, running = getattr(trimmer, "_last", None), trimmer._running
            passed = last is not None and last >= last_end[0] and running is not None and running.done()
            if not passed:
                await asyncio.sleep(0.05)
        counts = {name: getattr(trimmer, name, None) for name in ("trims", "collections", "collected")}
        return web.json_response({"passed": passed, "waited_s": round(time.monotonic() - started, 2), **counts})

    app.router.add_get(SETTLED_PATH, settled)
    # Served as `agent-gateway serve` serves: its runner (connection limits, its request handler)
    # and its accepting site.
    runner = GatewayRunner(app, limits=ConnectionLimits.from_config(config.section("gateway")), access_log=None)
    await runner.setup()
    tune_gc_for_serving()
    site = GuardedTCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


# -- the measurements --------------------------------------------------------------------------------
def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _largest_mappings(pid: int) -> list[tuple[str, float]]:
    """The process's mappings with the most resident memory (name, MB)."""
    out: list[tuple[str, float]] = []
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else "[anon]"
        elif fields[0] == "Rss:":
            out.append((name, round(int(fields[1]) / 1024, 1)))
    return sorted(out, key=lambda item: -item[1])[:6]


def _body(model: str) -> dict[str, Any]:
    return {
        "requestId": os.urandom(8).hex(),
        "agentId": "chat-only",
        "sessionId": os.urandom(6).hex(),
        "message": "go",
        "options": {"model": model},
    }


async def _one_run(http: aiohttp.ClientSession, url: str, deltas: int) -> int:
    """Create and stream one run to its end; the number of events received."""
    async with http.post(url + "/v1/runs?stream=1", json=_body(f"n{deltas}")) as response:
        assert response.status == 201, await response.text()
        events = 0
        async for chunk in response.content.iter_chunked(1 << 16):
            events += chunk.count(b"\nid: ") + chunk.startswith(b"id: ")
        return events


async def _runs(url: str, pid: int, runs: int, deltas: int, trace: bool) -> dict[str, Any]:
    samples: list[tuple[int, int]] = [(0, _rss_kb(pid))]
    baseline = 0
    started = time.monotonic()
    heap: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        if trace:
            await (await http.get(url + HEAP_PATH + "?mark=start")).read()
        for number in range(1, runs + 1):
            events = await _one_run(http, url, deltas)
            if events < deltas:
                raise RuntimeError(f"run {number}: {events} events")
            if number == min(10, runs):
                baseline = _rss_kb(pid)
                samples.append((number, baseline))
                # The same level once the trimmer has passed: a baseline that does not depend on
                # whether the sample caught the last run's memory before or after a trim.
                settled_10_pass = await (await http.get(url + SETTLED_PATH)).json()
                settled_10 = _rss_kb(pid)
                print(
                    json.dumps(
                        {"run": number, "rss_mb": round(baseline / 1024, 1), "settled": round(settled_10 / 1024, 1)}
                    ),
                    flush=True,
                )
                if trace:
                    heap["first_10_runs_left"] = await (await http.get(url + HEAP_PATH + "?diff=start")).json()
                    await (await http.get(url + HEAP_PATH + "?mark=baseline")).read()
            elif number % 50 == 0 or number == runs:
                samples.append((number, _rss_kb(pid)))
                print(json.dumps({"run": number, "rss_mb": round(samples[-1][1] / 1024, 1)}), flush=True)
        if trace:
            heap["grew_after_10_runs"] = await (await http.get(url + HEAP_PATH + "?diff=baseline")).json()
        end = samples[-1][1]
        # Settled: after the gateway's own trimmer pass that follows the last run (no forced collect).
        settled_pass = await (await http.get(url + SETTLED_PATH)).json()
        settled = _rss_kb(pid)
        await (await http.get(url + HEAP_PATH + "?trim=1")).read()
        trimmed = _rss_kb(pid)
        mappings = _largest_mappings(pid)
    return {
        "runs": runs,
        "deltas": deltas,
        "seconds": round(time.monotonic() - started, 1),
        "rss_mb_at_start": round(samples[0][1] / 1024, 1),
        "rss_mb_after_10_runs": round(baseline / 1024, 1),
        "rss_mb_at_end": round(end / 1024, 1),
        "rss_mb_end_minus_after_10": round((end - baseline) / 1024, 1),
        "rss_mb_settled": round(settled / 1024, 1),
        "rss_mb_settled_minus_after_10": round((settled - baseline) / 1024, 1),
        "settled_after_trimmer_pass": settled_pass,
        "rss_mb_after_10_runs_settled": round(settled_10 / 1024, 1),
        "after_10_runs_trimmer_pass": settled_10_pass,
        "rss_mb_settled_minus_after_10_settled": round((settled - settled_10) / 1024, 1),
        "rss_mb_max": round(max(kb for _, kb in samples) / 1024, 1),
        "rss_mb_at_end_after_gc_and_malloc_trim": round(trimmed / 1024, 1),
        "largest_mappings_mb": mappings,
        "samples_mb": [(n, round(kb / 1024, 1)) for n, kb in samples],
        **({"tracemalloc": heap} if trace else {}),
    }


async def _idle_client(host: str, port: int, path: str) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
    head = await reader.readuntil(b": stream open\n\n")  # the response headers, then the opening comment
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head[:200].decode(errors="replace"))
    return writer


async def _clients(url: str, pid: int, count: int, trace: bool) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    async with aiohttp.ClientSession(headers={"X-Agent-Gateway-Client": "bench"}) as http:
        async with http.post(url + "/v1/runs", json=_body("hang")) as created:
            run_id = (await created.json())["hostRunId"]
        path = f"/v1/runs/{run_id}/stream"
        # One stream first: the code paths of a stream are warm before the baseline.
        writers = [await _idle_client(host, int(port), path)]
        if trace:
            await (await http.get(url + HEAP_PATH + "?mark=clients")).read()
        before = _rss_kb(pid)
        started = time.monotonic()
        for first in range(1, count, 500):  # 500 connections at a time
            batch = [_idle_client(host, int(port), path) for _ in range(first, min(count, first + 500))]
            writers += await asyncio.gather(*batch)
        after = _rss_kb(pid)
        connect_seconds = time.monotonic() - started
        # What the idle streams hold, by traceback (tracing inflates RSS: the KB figure is not it).
        held = None
        if trace:
            by_traceback = await (await http.get(url + HEAP_PATH + "?diff=clients&recent=1&top=30")).json()
            by_line = await (await http.get(url + HEAP_PATH + "?diff=clients&by=lineno&top=30")).json()
            held = {"by_traceback": by_traceback, "by_line": by_line}
        async with http.get(url + "/metrics") as response:
            streams = [
                line for line in (await response.text()).splitlines() if line.startswith("agent_gateway_streams_open")
            ]
        async with http.post(f"{url}/v1/runs/{run_id}/cancel") as cancelled:
            await cancelled.read()
        for writer in writers:
            writer.close()
    return {
        "clients": count,
        "connect_seconds": round(connect_seconds, 1),
        "open_streams_metric": streams,
        "rss_mb_before": round(before / 1024, 1),
        "rss_mb_with_clients": round(after / 1024, 1),
        "kb_per_client": round((after - before) / (count - 1), 2),
        **({"tracemalloc_held": held} if held is not None else {}),
    }


def _start(command: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("http"):
        proc.kill()
        raise RuntimeError(f"{command[1]} did not start: {line!r}")
    return proc, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=10_000, help="idle SSE clients (0: skip)")
    parser.add_argument("--tracemalloc", action="store_true", help="trace the gateway's allocations")
    parser.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the gateway process only (e.g. PYTHONMALLOC=pymalloc); repeatable",
    )
    parser.add_argument("--serve", nargs=2, metavar=("DATA_DIR", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    _raise_fd_limit()
    if args.serve:
        asyncio.run(_serve(args.serve[0], args.serve[1], args.tracemalloc))
        return
    upstream, base_url = _start([sys.executable, str(ROOT / "bench" / "bench_fairness.py"), "--upstream"], ENV)
    try:
        with tempfile.TemporaryDirectory() as data_dir:
            command = [sys.executable, __file__, "--serve", data_dir, base_url]
            gateway_env = {**ENV, **dict(item.split("=", 1) for item in args.gateway_env)}
            gateway, url = _start(command + (["--tracemalloc"] if args.tracemalloc else []), gateway_env)
            try:
                environ = Path(f"/proc/{gateway.pid}/environ").read_bytes().split(b"\0")
                allocator = next((item[12:].decode() for item in environ if item.startswith(b"PYTHONMALLOC=")), "")
                report: dict[str, Any] = {"load": load(), "gateway_pythonmalloc": allocator or "(default: pymalloc)"}
                if args.runs:
                    report["runs"] = asyncio.run(_runs(url, gateway.pid, args.runs, args.deltas, args.tracemalloc))
                if args.clients:
                    report["idle_clients"] = asyncio.run(_clients(url, gateway.pid, args.clients, args.tracemalloc))
                print(json.dumps(report, indent=1))
            finally:
                gateway.terminate()
                gateway.wait(timeout=60)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)


if __name__ == "__main__":
    main()
