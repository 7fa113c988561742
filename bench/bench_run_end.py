"""What a run's end costs the next run: the session index's work at a run's end, and a new run's
first delta right after a long one (issue 31, point 1).

    python bench/bench_run_end.py [--rounds 3] [--end-events 100000] [--runs 10] [--deltas 20000]
        [--baseline-python /path/to/venv-of-main/bin/python]

A gateway process (SQLite, the `burst` runtime of `_burst_server.py`, its indexer timed by
`_run_end_server.py`) per variant and round. In each:

- **run end**: one run of ``--end-events`` deltas, read to its end by one client; then the worker
  time of the indexer's call that took its end (thread CPU and wall), the loop's time in the
  indexer's listener, and the loop CPU spent folding its events while they were published;
- **back to back**: ``--runs`` runs of ``--deltas`` deltas, each POSTed the moment the previous
  one's stream closed and attached right after its POST; POST → first ``message.delta`` on the
  stream (and the POST alone), median and worst over the rounds' runs.

With ``--baseline-python`` (an interpreter whose ``agent_gateway`` is another checkout, e.g. main
in a second worktree), each round runs the baseline and this checkout alternately and the figures
are printed side by side, medians over rounds. The fixture's own rate: the deltas/s each run's
client received (the burst runtime emits as fast as the gateway takes them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ENV, HERE, ROOT, load, median

SERVER = HERE / "_run_end_server.py"


def _body(events: int) -> dict[str, Any]:
    return {
        "requestId": os.urandom(8).hex(),
        "agentId": "burst",
        "sessionId": os.urandom(6).hex(),
        "message": "go",
        "options": {"events": events},
    }


async def _one_run(http: aiohttp.ClientSession, url: str, events: int) -> dict[str, float]:
    """POST a run, attach to its stream at once, read it to its end."""
    start = time.perf_counter()
    async with http.post(url + "/v1/runs", json=_body(events)) as created:
        run_id = (await created.json())["hostRunId"]
    posted = time.perf_counter()
    first = last = 0.0
    async with http.get(f"{url}/v1/runs/{run_id}/stream") as response:
        async for line in response.content:
            if line.startswith(b"event: message.delta"):
                first = time.perf_counter()
                break
        while await response.content.read(1 << 16):
            pass
        last = time.perf_counter()
    if not first:
        raise RuntimeError(f"run {run_id}: no delta on its stream")
    return {
        "run": run_id,
        "post_ms": (posted - start) * 1000,
        "first_delta_ms": (first - start) * 1000,
        "rate": events / max(last - first, 1e-9),
    }


def _index_log(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {line["run"]: line for line in lines}


async def _drive(url: str, args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with aiohttp.ClientSession() as http:
        await _one_run(http, url, 200)  # warm-up
        async with http.get(url + "/v1/sessions") as settled:  # waits for the index
            await settled.read()
        end = await _one_run(http, url, args.end_events)
        async with http.get(url + "/v1/sessions") as settled:
            await settled.read()
        back = [await _one_run(http, url, args.deltas) for _ in range(args.runs)]
        async with http.get(url + "/v1/sessions") as settled:
            await settled.read()
    return end, back


def _round(python: str, args: argparse.Namespace, baseline: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data_dir:
        log_path = Path(data_dir) / "index.log"
        # A baseline runs its own checkout only: this one is neither on its path (PYTHONPATH) nor
        # its working directory, whose package metadata (an editable install's) lists this
        # checkout's plugins.
        proc = subprocess.Popen(
            [python, str(SERVER), data_dir],
            stdout=subprocess.PIPE,
            text=True,
            cwd=data_dir if baseline else ROOT,
            env={**ENV, "BENCH_INDEX_LOG": str(log_path), **({"PYTHONPATH": ""} if baseline else {})},
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("http"):
                raise RuntimeError(f"the bench gateway did not start ({python})")
            end, back = asyncio.run(_drive(url, args))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        index = _index_log(log_path)
    ended = index.get(end["run"], {})
    return {
        "end_worker_cpu_ms": ended.get("worker_cpu_ms", float("nan")),
        "end_worker_wall_ms": ended.get("worker_wall_ms", float("nan")),
        "end_on_run_ms": ended.get("on_run_ms", float("nan")),
        "end_fold_cpu_ms": ended.get("fold_cpu_ms", float("nan")),
        "end_rate": end["rate"],
        "first_delta_ms": [r["first_delta_ms"] for r in back],
        "post_ms": [r["post_ms"] for r in back],
        "back_worker_cpu_ms": [index.get(r["run"], {}).get("worker_cpu_ms", float("nan")) for r in back],
        "back_rate": median([r["rate"] for r in back]),
    }


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    firsts = [ms for r in results for ms in r["first_delta_ms"]]
    posts = [ms for r in results for ms in r["post_ms"]]
    return {
        "end_worker_cpu_ms": median([r["end_worker_cpu_ms"] for r in results]),
        "end_worker_wall_ms": median([r["end_worker_wall_ms"] for r in results]),
        "end_on_run_ms": median([r["end_on_run_ms"] for r in results]),
        "end_fold_cpu_ms": median([r["end_fold_cpu_ms"] for r in results]),
        "end_rate": median([r["end_rate"] for r in results]),
        "first_delta_median_ms": median(firsts),
        "first_delta_worst_ms": max(firsts),
        "first_delta_worst_per_round_ms": [max(r["first_delta_ms"]) for r in results],
        "post_median_ms": median(posts),
        "back_worker_cpu_median_ms": median([ms for r in results for ms in r["back_worker_cpu_ms"]]),
        "back_rate": median([r["back_rate"] for r in results]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--end-events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--baseline-python", default=None, help="an interpreter running the baseline checkout")
    args = parser.parse_args()
    variants = {"this": sys.executable}
    if args.baseline_python:
        variants = {"baseline": args.baseline_python, **variants}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    print(f"load before: {load()}", flush=True)
    for number in range(args.rounds):
        names = list(variants) if number % 2 == 0 else list(reversed(variants))  # interleaved
        for name in names:
            result = _round(variants[name], args, baseline=name == "baseline")
            results[name].append(result)
            first = result["first_delta_ms"]
            print(
                f"round {number + 1} {name:<8} end: worker {result['end_worker_cpu_ms']:7.1f} ms CPU"
                f" ({result['end_worker_wall_ms']:7.1f} ms wall), fold while streaming"
                f" {result['end_fold_cpu_ms']:6.1f} ms | first delta median {median(first):5.1f}"
                f" worst {max(first):5.1f} ms | {result['back_rate']:,.0f} deltas/s | load {load()}",
                flush=True,
            )
    summaries = {name: _summary(runs) for name, runs in results.items()}
    for name, summary in summaries.items():
        print(json.dumps({"variant": name, **{k: v for k, v in summary.items()}}))
    this = summaries["this"]
    print(
        f"\nrun of {args.end_events:,} events ending (medians of {args.rounds}; the run streamed"
        f" {this['end_rate']:,.0f} deltas/s):"
    )
    for name, summary in summaries.items():
        print(
            f"  {name:<8} worker {summary['end_worker_cpu_ms']:8.2f} ms CPU,"
            f" {summary['end_worker_wall_ms']:8.2f} ms wall; listener {summary['end_on_run_ms']:.2f} ms;"
            f" folded while streaming {summary['end_fold_cpu_ms']:.1f} ms CPU"
        )
    print(f"{args.runs} runs of {args.deltas:,} deltas back to back x {args.rounds} rounds, POST -> first delta:")
    for name, summary in summaries.items():
        print(
            f"  {name:<8} median {summary['first_delta_median_ms']:6.2f} ms, worst"
            f" {summary['first_delta_worst_ms']:6.2f} ms (per round"
            f" {', '.join(f'{ms:.1f}' for ms in summary['first_delta_worst_per_round_ms'])});"
            f" POST alone {summary['post_median_ms']:.2f} ms; {summary['back_rate']:,.0f} deltas/s"
        )
    if "baseline" in summaries:
        base = summaries["baseline"]
        print(
            f"ratios this/baseline: end worker CPU {this['end_worker_cpu_ms'] / base['end_worker_cpu_ms']:.3f},"
            f" first delta median {this['first_delta_median_ms'] / base['first_delta_median_ms']:.2f},"
            f" worst {this['first_delta_worst_ms'] / base['first_delta_worst_ms']:.2f}"
        )
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
