"""A burst of SSE connections: how long the gateway's loop stalls while N streams arrive at once,
and how fast `GET /v1/health` is answered meanwhile.

    python bench/bench_burst.py [--streams 500] [--runs 1] [--rounds 5] [--baseline /work/wt-burst-base]

The gateway is served as `agent-gateway serve` serves it (`GatewayRunner`, `GuardedTCPSite` with
its default backlog, connection limits from the config) with the `burst` runtime of
`_burst_server.py`, in its own process. Each round starts a fresh gateway, creates `--runs` runs
that stay open (each waits for more subscribers than will come) and opens one stream first (the
code paths are warm). Then, from separate processes:

- the burst client (`--burst-client`) opens `--streams` connections at once (every connect issued
  before the first response is read), sends each a `GET /v1/runs/<id>/stream` (the streams dealt
  round-robin over the runs) and waits for every response's headers and opening comment;
- the prober (`--probe`) sends `GET /v1/health` on one kept-alive connection every 2 ms.

The gateway's loop-lag histogram is read from `/metrics` before and after the burst (how many
25 ms samples ran over 50 ms late), and its exact worst lag from a bench-only route (the lag
monitor's own maximum, reset before the burst). Health probes sent between the burst's first
connect and the last stream's headers (plus 100 ms) give p50/p99/max. The lag and the probes are
wall time, which a busy machine stretches (the gateway waits for a core); the worst loop turn's
CPU time (the loop thread's, `turn_cpu_max_ms`) is what the gateway itself held the loop for.

`--baseline ROOT` serves another checkout's gateway (e.g. a `git worktree` of main) with the same
bench code, in the same invocation, rounds interleaved; the report gives medians per tree. The
client's own rate (the same client against a bare asyncio server answering each request at
once) is measured in every round, so it shows the client was not what took the time.

Diagnosis aids (never the documented figures): BENCH_TICKS=1 prints every loop turn over 10 ms
(what was ready, which tasks were created) and GC passes over 5 ms to stderr; BENCH_PROFILE=FILE
writes a cProfile of the burst; BENCH_BACKLOG=N sets the listen backlog; BENCH_HEALTH_PATH
another probe path (e.g. `/v1/health?probe=live`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OPENING = b": stream open\n\n"
PROBE_EVERY = 0.002
STALL_MS = 50.0  # the goals: no loop stall over this while the burst arrives,
HEALTH_MS = 20.0  # and health answered within this


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- which checkout's gateway is imported --------------------------------------------------------
class _Tree(importlib.abc.MetaPathFinder):
    """Imports `agent_gateway` from the checkout at `root` (its `gateway/`, `hookspecs/` and
    `plugins/` folders, as setup.cfg maps them), ahead of the installed (editable) one."""

    def __init__(self, root: Path) -> None:
        self.packages = {
            "agent_gateway": root / "gateway",
            "agent_gateway.hookspecs": root / "hookspecs",
            "agent_gateway.plugins": root / "plugins",
        }

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> Any:
        folder = self.packages.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


# -- the gateway (its own process) -----------------------------------------------------------------
def _use_tree(root: Path) -> None:
    sys.meta_path.insert(0, _Tree(root))
    import agent_gateway

    here = os.path.realpath(agent_gateway.__file__)
    assert here.startswith(os.path.realpath(root) + os.sep), here  # the checkout asked for


async def _serve(data_dir: str) -> None:
    sys.path.insert(0, str(HERE))
    from _burst_server import BurstPlugin, BurstRuntime
    from aiohttp import web

    from agent_gateway.app import GATEWAY_KEY, create_app
    from agent_gateway.cli import tune_gc_for_serving
    from agent_gateway.config import Config
    from agent_gateway.plugin_host import PluginHost
    from agent_gateway.server.http_server import ConnectionLimits, GatewayRunner, GuardedTCPSite

    overrides: dict[str, dict[str, Any]] = {"gateway": {"data_dir": data_dir, "max_connections": 100_000}}
    config = Config.load(None, env={}, overrides=overrides)
    app = create_app(config, PluginHost.load(env={}, extra=(BurstPlugin(),)))
    BurstRuntime.bus = app[GATEWAY_KEY].bus
    monitor = app[GATEWAY_KEY].loop_monitor

    turns = _TurnWatch(asyncio.get_running_loop()) if not os.environ.get("BENCH_TICKS") else None

    async def lag(request: web.Request) -> web.Response:
        """The lag monitor's worst lag since the last call (in ms), and the worst loop turn's
        CPU (the loop thread's), then reset."""
        worst, monitor.max = monitor.max, 0.0
        turn_cpu = turns.reset() if turns is not None else 0.0
        return web.json_response({"max_ms": worst * 1000, "turn_cpu_ms": turn_cpu * 1000})

    app.router.add_get("/bench/lag", lag)
    profile_to = os.environ.get("BENCH_PROFILE")  # a profiling aid: cProfile of the burst, to this file
    profiler: Any = None

    async def profile(request: web.Request) -> web.Response:
        nonlocal profiler
        import cProfile

        if profiler is None:
            profiler = cProfile.Profile()
            profiler.enable()
        else:
            profiler.disable()
            profiler.dump_stats(profile_to)
            profiler = None
        return web.json_response({})

    if profile_to:
        app.router.add_get("/bench/profile", profile)
    if os.environ.get("BENCH_TICKS"):  # a diagnosis aid: loop turns and GC passes over 10 ms, to stderr
        _watch_ticks(asyncio.get_running_loop())
    runner = GatewayRunner(app, limits=ConnectionLimits.from_config(config.section("gateway")), access_log=None)
    await runner.setup()
    tune_gc_for_serving()
    backlog = os.environ.get("BENCH_BACKLOG")  # an experiment's override
    site = GuardedTCPSite(runner, "127.0.0.1", 0, **({"backlog": int(backlog)} if backlog else {}))  # as `serve`
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


class _TurnWatch:
    """The worst CPU time (of the loop's thread) one loop turn took: what the gateway itself held
    the loop for, whatever else the machine runs (the lag monitor's figure is wall time)."""

    def __init__(self, loop: Any) -> None:
        self.worst = 0.0
        run_once = loop._run_once

        def timed() -> None:
            started = time.thread_time()
            run_once()
            took = time.thread_time() - started
            if took > self.worst:
                self.worst = took

        loop._run_once = timed

    def reset(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst


def _watch_ticks(loop: Any) -> None:
    import collections
    import gc

    run_once = loop._run_once
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        elif (took := time.perf_counter() - gc_started[0]) > 0.005:
            print(f"gc gen{info['generation']} {took * 1000:.1f} ms", file=sys.stderr, flush=True)

    gc.callbacks.append(on_gc)

    created: collections.Counter[str] = collections.Counter()

    def factory(loop: Any, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created[getattr(coro, "__qualname__", repr(coro))] += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)

    def timed() -> None:
        kinds = collections.Counter(repr(getattr(h, "_callback", h))[:60] for h in loop._ready)
        kinds.update({f"created {k}": v for k, v in created.items()})
        created.clear()
        before, started = _schedstat(), time.perf_counter()
        run_once()
        took = time.perf_counter() - started
        if took > 0.01:
            # The turn's wall time (its select's wait included) = CPU + waiting for a core + the rest
            # (waiting in select, or for the GIL).
            cpu, queued = (after - first for after, first in zip(_schedstat(), before, strict=True))
            top = kinds.most_common(8)
            print(
                f"turn {took * 1000:.1f} ms (cpu {cpu / 1e6:.1f}, waiting for a core {queued / 1e6:.1f})"
                f" {len(kinds)} {top}",
                file=sys.stderr,
                flush=True,
            )

    loop._run_once = timed


def _schedstat() -> tuple[int, int]:
    """This thread's nanoseconds on a CPU and waiting on a run queue so far (the kernel's count)."""
    on_cpu, queued, _ = Path("/proc/thread-self/schedstat").read_text().split()
    return int(on_cpu), int(queued)


# -- a bare server answering every request at once (the client's own rate) ------------------------
class _Bare(asyncio.Protocol):
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%b\r\n" % (len(OPENING), OPENING)
            )


async def _bare_server() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Bare, "127.0.0.1", 0, backlog=4096)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# -- the burst client (its own process) --------------------------------------------------------------
class _Stream(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[float]) -> None:
        self.request = request
        self.done = done
        self.seen = b""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.seen += data
        if OPENING in self.seen:
            if not self.seen.startswith(b"HTTP/1.1 200"):
                self.done.set_exception(RuntimeError(self.seen[:200].decode(errors="replace")))
            else:
                self.done.set_result(time.monotonic())
            self.seen = b""

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("closed before the opening comment"))


async def _burst(url: str, paths: list[str]) -> None:
    """Waits for `go` on stdin, opens every stream at once, prints the figures, then holds the
    connections until stdin closes."""
    loop = asyncio.get_running_loop()
    host, port = url.removeprefix("http://").split(":")
    requests = [
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode() for path in paths
    ]
    print("waiting", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    cpu0 = time.process_time()
    started = time.monotonic()
    done = [loop.create_future() for _ in requests]

    async def one(request: bytes, future: asyncio.Future[float]) -> Any:
        transport, _ = await loop.create_connection(lambda: _Stream(request, future), host, int(port))
        await future
        return transport

    transports = await asyncio.gather(*(one(r, f) for r, f in zip(requests, done, strict=True)))
    ended = time.monotonic()
    cpu = time.process_time() - cpu0
    waits = sorted((f.result() - started) * 1000 for f in done)
    print(
        json.dumps(
            {
                "started": started,
                "ended": ended,
                "streams": len(requests),
                "seconds": ended - started,
                "cpu_seconds": cpu,
                "headers_ms_p50": statistics.median(waits),
                "headers_ms_max": waits[-1],
            }
        ),
        flush=True,
    )
    await loop.run_in_executor(None, sys.stdin.read)
    for transport in transports:
        transport.close()


# -- the health prober (its own process) ---------------------------------------------------------------
def _probe(url: str) -> None:
    """GET /v1/health every PROBE_EVERY on one kept-alive connection until stdin closes; prints
    (sent at, latency ms) per probe."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = (
        f"GET {os.environ.get('BENCH_HEALTH_PATH', '/v1/health')} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    )
    stop = [False]

    def wait_stdin() -> None:
        sys.stdin.read()
        stop[0] = True

    import threading

    threading.Thread(target=wait_stdin, daemon=True).start()
    print("ready", flush=True)
    samples: list[tuple[float, float]] = []
    buffer = b""
    while not stop[0] and len(samples) < 100_000:
        sent = time.monotonic()
        sock.sendall(request)
        while True:
            head, sep, rest = buffer.partition(b"\r\n\r\n")
            if sep:
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                if len(rest) >= length:
                    buffer = rest[length:]
                    break
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the gateway closed the probe's connection")
            buffer += chunk
        samples.append((sent, (time.monotonic() - sent) * 1000))
        time.sleep(PROBE_EVERY)  # pacing the probes
    print(json.dumps(samples), flush=True)


# -- the parent ----------------------------------------------------------------------------------------
def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()


def _lag_buckets(url: str) -> dict[str, int]:
    out = {}
    for line in _get(url + "/metrics").splitlines():
        if line.startswith("agent_gateway_loop_lag_seconds_bucket"):
            out[line.split('le="')[1].split('"')[0]] = int(float(line.split()[-1]))
    return out


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _burst_against(url: str, paths: list[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    client, line = _start(["--burst-client", url, json.dumps(paths)])
    assert line == "waiting", line
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write("go\n")
    client.stdin.flush()
    return client, json.loads(client.stdout.readline())


def _end(proc: subprocess.Popen[str]) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    out = proc.stdout.read()
    proc.wait(timeout=60)
    return out


def _round(root: Path, streams: int, runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data_dir:
        gateway, url = _start(["--serve", str(root), data_dir])
        try:
            run_ids = [
                _post(
                    url + "/v1/runs",
                    {
                        "requestId": os.urandom(8).hex(),
                        "agentId": "burst",
                        "sessionId": os.urandom(6).hex(),
                        "message": "go",
                        "options": {"subscribers": 10**9},  # never reached: the run stays open
                    },
                )["hostRunId"]
                for _ in range(runs)
            ]
            paths = [f"/v1/runs/{run_ids[i % runs]}/stream" for i in range(streams)]
            warm, _ = _burst_against(url, paths[:1])  # one stream first: its code paths are warm
            prober, line = _start(["--probe", url])
            assert line == "ready", line
            time.sleep(0.2)  # some probes before the burst
            before = _lag_buckets(url)
            _get(url + "/bench/lag")  # resets the worst lag
            if os.environ.get("BENCH_PROFILE"):
                _get(url + "/bench/profile")
            load = _load()
            client, burst = _burst_against(url, paths)
            time.sleep(0.1)
            lag = _get(url + "/bench/lag")
            if os.environ.get("BENCH_PROFILE"):
                _get(url + "/bench/profile")
            after = _lag_buckets(url)
            probes = json.loads(_end(prober).strip().splitlines()[-1])
            _end(client)
            _end(warm)
        finally:
            gateway.terminate()
            gateway.wait(timeout=60)
    window = [ms for sent, ms in probes if burst["started"] <= sent <= burst["ended"] + 0.1]
    before_burst = [ms for sent, ms in probes if sent < burst["started"]]  # the machine's floor
    over_50 = (after["+Inf"] - before["+Inf"]) - (after["0.05"] - before["0.05"])
    return {
        "load": load,
        "burst_ms": round(burst["seconds"] * 1000, 1),
        "headers_ms_p50": round(burst["headers_ms_p50"], 1),
        "client_cpu_ms": round(burst["cpu_seconds"] * 1000, 1),
        "streams_per_s": round(streams / burst["seconds"]),
        "loop_lag_max_ms": round(lag["max_ms"], 1),
        "turn_cpu_max_ms": round(lag["turn_cpu_ms"], 1),
        "lag_samples_over_50ms": over_50,
        "health_probes": len(window),
        "health_ms_p50": round(statistics.median(window), 2) if window else None,
        "health_ms_p99": round(sorted(window)[min(len(window) - 1, round(0.99 * (len(window) - 1)))], 2)
        if window
        else None,
        "health_ms_max": round(max(window), 2) if window else None,
        "health_ms_max_before_burst": round(max(before_burst), 2) if before_burst else None,
    }


def _client_rate(streams: int) -> dict[str, Any]:
    """The burst client against a bare asyncio server: its own pace."""
    server, url = _start(["--bare-server"])
    try:
        client, burst = _burst_against(url, ["/x"] * streams)
        _end(client)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return {
        "burst_ms": round(burst["seconds"] * 1000, 1),
        "streams_per_s": round(streams / burst["seconds"]),
        "streams_per_cpu_s": round(streams / burst["cpu_seconds"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1, help="the streams are dealt over this many open runs")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout (e.g. a worktree of main) measured beside")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--burst-client", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _raise_fd_limit()
    if args.serve:
        _use_tree(Path(args.serve[0]))
        asyncio.run(_serve(args.serve[1]))
        return
    if args.bare_server:
        asyncio.run(_bare_server())
        return
    if args.burst_client:
        asyncio.run(_burst(args.burst_client[0], json.loads(args.burst_client[1])))
        return
    if args.probe:
        _probe(args.probe)
        return
    trees = {"this": ROOT}
    if args.baseline:
        trees = {"baseline": args.baseline.resolve(), **trees}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    client_rates: list[dict[str, Any]] = []
    for number in range(args.rounds):
        client_rates.append(_client_rate(args.streams))
        order = list(trees) if number % 2 == 0 else list(reversed(trees))  # interleaved, alternating first
        for name in order:
            result = _round(trees[name], args.streams, args.runs)
            results[name].append(result)
            print(json.dumps({"round": number + 1, "tree": name, **result}), flush=True)
        print(json.dumps({"round": number + 1, "client_alone": client_rates[-1]}), flush=True)

    def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
        keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float))]
        return {k: round(statistics.median(r[k] for r in rows if r[k] is not None), 2) for k in keys}

    summary: dict[str, Any] = {
        "streams": args.streams,
        "runs": args.runs,
        "rounds": args.rounds,
        "load_now": _load(),
        "client_alone_median": medians(client_rates),
        **{name: medians(rows) for name, rows in results.items()},
        "loop_lag_max_ms_by_round": {name: [r["loop_lag_max_ms"] for r in rows] for name, rows in results.items()},
    }
    summary["rounds_meeting_goals"] = {
        name: {
            "loop_lag_max_under_50ms": sum(r["loop_lag_max_ms"] <= STALL_MS for r in rows),
            "health_max_under_20ms": sum((r["health_ms_max"] or 0) <= HEALTH_MS for r in rows),
        }
        for name, rows in results.items()
    }
    if "baseline" in results:
        summary["ratios_this_over_baseline"] = {
            key: round(summary["this"][key] / max(summary["baseline"][key], 0.001), 2)
            for key in ("loop_lag_max_ms", "turn_cpu_max_ms", "health_ms_p99", "health_ms_max", "burst_ms")
        }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
