"""Benchmarks 2 to 6 of docs/performance.md, each a ratio against a baseline measured in the same run.

    python bench/bench_suite.py latency|memory|resume|fanout|startup [--quick] [--repeat N]

- latency: emit-to-client delivery latency at 1,000 events/s to 100 SSE clients (p50/p99), against
  the same run to 1 client.
- memory: a client reading 10 events/s while a run emits 100,000 deltas: gateway peak RSS over its
  idle RSS, against the same run with a client reading at full speed; the slow client's reassembled
  text must equal the run's text.
- resume: Last-Event-ID near the start of a finished 100,000-event run, once the session index has
  it: time to first event (against a cursor near the end) and replay rate (against raw sqlite3
  SELECT pages of the same rows).
- fanout: 1,000 concurrent SSE clients over 200 runs: every stream complete, no error.
- startup: `agent-gateway serve` to a healthy /v1/health, against `python -c "import aiohttp"`.

The gateway runs in its own process (`_burst_server.py`), the clients in one or two others
(`_sse_client.py`); CLOCK_MONOTONIC is system-wide on Linux, so times compare across processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import click
from _common import ENV, ROOT, Clients, gateway, load, median, percentile, raw_sqlite_select_rate


def _cursor(seq: int) -> str:
    return f"{seq:018d}"


# -- 2. latency ------------------------------------------------------------------------------------------
def latency_once(clients: int, events: int, rate: float = 1000.0) -> dict[str, Any]:
    with gateway() as gw:
        run_id = gw.create_run({"events": events, "rate": rate, "stamp": True, "subscribers": clients})
        readers = Clients(gw.url, [{"run": run_id}] * clients, processes=2 if clients > 1 else 1, mode="latency")
        results = readers.results()
    errors = [r["error"] for r in results if r["error"]]
    samples = [x for r in results for x in r["latencies"]]
    return {
        "p50": percentile(samples, 50),
        "p99": percentile(samples, 99),
        "max": max(samples),
        "samples": len(samples),
        "complete": sum(1 for r in results if r["terminal"]),
        "errors": len(errors),
    }


def latency(quick: bool, repeat: int) -> dict[str, Any]:
    events = 2000 if quick else 5000
    runs_100, runs_1 = [], []
    for _ in range(repeat):
        runs_1.append(latency_once(1, events))
        runs_100.append(latency_once(100, events))
    one = {k: median([r[k] for r in runs_1]) for k in ("p50", "p99")}
    hundred = {k: median([r[k] for r in runs_100]) for k in ("p50", "p99")}
    return {
        "name": "2. latency at 1,000 ev/s, 100 clients",
        "baseline": f"1 client p50 {one['p50']:.2f} ms, p99 {one['p99']:.2f} ms",
        "measured": f"100 clients p50 {hundred['p50']:.2f} ms, p99 {hundred['p99']:.2f} ms",
        "ratio": hundred["p99"] / one["p99"],
        "ratio_name": "p99 100 clients / 1 client",
        "detail": {"one": runs_1, "hundred": runs_100, "load": load()},
    }


# -- 3. memory under a slow client ---------------------------------------------------------------------------
def memory_once(events: int, slow: bool) -> dict[str, Any]:
    expected = "".join(f"{i:06d} " for i in range(events))
    with gateway() as gw, tempfile.TemporaryDirectory() as tmp:
        time.sleep(0.5)
        idle = gw.status()["VmRSS"]
        flag = os.path.join(tmp, "drain")
        run_id = gw.create_run({"events": events, "distinct": True, "subscribers": 1})
        spec: dict[str, Any] = {"mode": "text"}
        if slow:
            spec.update(slow_rate=10, slow_until_file=flag, rcvbuf=16384)
        readers = Clients(gw.url, [{"run": run_id}], processes=1, **spec)
        started = time.monotonic()
        gw.wait_run(run_id)
        emitted_in = time.monotonic() - started
        rss_at_end = gw.status()["VmRSS"]
        Path(flag).touch()  # the slow client now reads at full speed
        result = readers.results()[0]
        peak = gw.status()["VmHWM"]
    return {
        "idle_kib": idle,
        "peak_kib": peak,
        "rss_at_end_kib": rss_at_end,
        "ratio": peak / idle,
        "text_ok": result["text"] == expected,
        "events_received": result["events"],
        "reconnects": result["reconnects"],
        "error": result["error"],
        "run_seconds": emitted_in,
    }


def memory(quick: bool, repeat: int) -> dict[str, Any]:
    events = 20_000 if quick else 100_000
    slows, fasts = [], []
    for _ in range(repeat):
        fasts.append(memory_once(events, slow=False))
        slows.append(memory_once(events, slow=True))
    slow = sorted(slows, key=lambda r: r["ratio"])[len(slows) // 2]
    fast = sorted(fasts, key=lambda r: r["ratio"])[len(fasts) // 2]
    ok = all(r["text_ok"] for r in slows + fasts)
    return {
        "name": f"3. slow client (10 ev/s), {events:,} deltas",
        "baseline": f"fast client: peak/idle RSS {fast['ratio']:.2f}",
        "measured": (
            f"slow client: peak/idle RSS {slow['ratio']:.2f} ({slow['peak_kib'] // 1024} MiB / "
            f"{slow['idle_kib'] // 1024} MiB); text identical: {ok}; slow client got "
            f"{slow['events_received']:,} events"
        ),
        "ratio": slow["ratio"],
        "ratio_name": "peak RSS / idle RSS",
        "detail": {"slow": slows, "fast": fasts, "load": load()},
    }


# -- 4. resume deep in a finished run --------------------------------------------------------------------------
def resume_once(events: int) -> dict[str, Any]:
    with gateway() as gw:
        run_id = gw.create_run({"events": events})
        gw.wait_run(run_id)
        # The session index folds the ended run on a worker (0.4-0.7 s for 100,000 events, holding
        # the GIL): a session list waits for it, so the resume below measures the replay alone.
        started = time.monotonic()
        gw.get("/v1/sessions?limit=1")
        out: dict[str, Any] = {"index_settled_s": time.monotonic() - started}
        total = out["total"] = int(gw.events(run_id, events, 20)[-1]["seq"])
        for name, after in (("deep", 10), ("shallow", total - 10)):
            result = Clients(gw.url, [{"run": run_id, "after": _cursor(after)}], processes=1).results()[0]
            if result["error"] or not result["terminal"] or result["events"] != total - after:
                raise RuntimeError(f"resume {name}: {result}")
            out[f"{name}_ttfe"] = result["first_event_at"] - result["connected_at"]
            out[f"{name}_rate"] = result["events"] / (result["done_at"] - result["connected_at"])
    return out


def resume(quick: bool, repeat: int) -> dict[str, Any]:
    events = 20_000 if quick else 100_000
    runs, raws = [], []
    for _ in range(repeat):
        runs.append(resume_once(events))
        raws.append(raw_sqlite_select_rate(events))
    deep_ttfe = median([r["deep_ttfe"] for r in runs])
    shallow_ttfe = median([r["shallow_ttfe"] for r in runs])
    rate = median([r["deep_rate"] for r in runs])
    raw = median(raws)
    return {
        "name": f"4. resume at seq 10 of a finished {events:,}-event run",
        "baseline": f"TTFE at the end {shallow_ttfe * 1000:.1f} ms; raw SELECT {raw:,.0f} rows/s",
        "measured": f"TTFE {deep_ttfe * 1000:.1f} ms; replay {rate:,.0f} ev/s",
        "ratio": rate / raw,
        "ratio_name": f"replay / raw SELECT (TTFE deep/end {deep_ttfe / shallow_ttfe:.2f})",
        "detail": {"runs": runs, "raw": raws, "load": load()},
    }


# -- 5. 1,000 clients over 200 runs ---------------------------------------------------------------------------------
def fanout_once(runs: int, per_run: int, events: int) -> dict[str, Any]:
    with gateway() as gw:
        run_ids = [gw.create_run({"events": events, "subscribers": per_run}) for _ in range(runs)]
        streams = [{"run": run_id} for run_id in run_ids for _ in range(per_run)]
        started = time.monotonic()
        readers = Clients(gw.url, streams, processes=2)
        results = readers.results()
        elapsed = time.monotonic() - started
        totals = {run_id: int(gw.events(run_id, events, 20)[-1]["seq"]) for run_id in run_ids}
    complete = sum(1 for r in results if r["terminal"] and r["events"] == totals[r["run"]] and not r["error"])
    delivered = sum(r["events"] for r in results)
    return {
        "streams": len(streams),
        "complete": complete,
        "errors": sum(1 for r in results if r["error"]),
        "first_errors": [r["error"] for r in results if r["error"]][:3],
        "elapsed": elapsed,
        "delivered_per_s": delivered / elapsed,
    }


def fanout(quick: bool, repeat: int) -> dict[str, Any]:
    events = 200 if quick else 1000
    results = [fanout_once(200, 5, events) for _ in range(repeat)]
    worst = min(results, key=lambda r: r["complete"])
    mid = sorted(results, key=lambda r: r["elapsed"])[len(results) // 2]
    return {
        "name": f"5. 1,000 SSE clients over 200 runs of {events:,} events",
        "baseline": f"{worst['streams']:,} streams opened",
        "measured": (
            f"{worst['complete']:,} complete, {worst['errors']} errors; {mid['elapsed']:.1f} s, "
            f"{mid['delivered_per_s']:,.0f} events delivered/s"
        ),
        "ratio": worst["complete"] / worst["streams"],
        "ratio_name": "complete / opened",
        "detail": {"runs": results, "load": load()},
    }


# -- 6. start-up ------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_command() -> list[str]:
    script = Path(sys.executable).parent / "agent-gateway"  # the console script, not a pyenv shim
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent_gateway.cli"]


def startup_once() -> float:
    port = _free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        started = time.monotonic()
        proc = subprocess.Popen(
            [*_serve_command(), "serve", "--port", str(port), "--data-dir", data_dir, "--log-format", "text"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            env=ENV,
        )
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=2) as response:
                        if response.status == 200:
                            return time.monotonic() - started
                except OSError:
                    if proc.poll() is not None:
                        raise RuntimeError("agent-gateway serve exited") from None
                    time.sleep(0.005)  # polling for the port to answer
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def import_aiohttp_once() -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import aiohttp"], check=True, cwd=ROOT, env=ENV)
    return time.monotonic() - started


def startup(quick: bool, repeat: int) -> dict[str, Any]:
    count = max(5, repeat)
    serve, base = [], []
    for _ in range(count):
        base.append(import_aiohttp_once())
        serve.append(startup_once())
    s, b = median(serve), median(base)
    return {
        "name": "6. start-up to healthy /v1/health",
        "baseline": f"python -c 'import aiohttp' {b * 1000:.0f} ms",
        "measured": f"agent-gateway serve {s * 1000:.0f} ms",
        "ratio": s / b,
        "ratio_name": "serve / import aiohttp",
        "detail": {"serve": serve, "import_aiohttp": base, "load": load()},
    }


BENCHMARKS = {"latency": latency, "memory": memory, "resume": resume, "fanout": fanout, "startup": startup}


@click.command()
@click.argument("names", nargs=-1, type=click.Choice(sorted(BENCHMARKS)))
@click.option("--quick", is_flag=True, help="Smaller runs (a smoke test, not the documented figures).")
@click.option("--repeat", default=3, show_default=True, help="Repetitions; the median is reported.")
def main(names: tuple[str, ...], quick: bool, repeat: int) -> None:
    for name in names or tuple(BENCHMARKS):
        row = BENCHMARKS[name](quick, repeat)
        print(
            f"{row['name']}\n  baseline: {row['baseline']}\n  measured: {row['measured']}\n"
            f"  ratio ({row.get('ratio_name', 'measured / baseline')}): {row['ratio']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
