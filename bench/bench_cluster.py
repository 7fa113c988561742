"""Three gateway instances on one PostgreSQL database and one Redis, on this machine.

    python bench/bench_cluster.py [--repeat 2] [--events 2000] [--postgres-url URL] [--redis-url URL]

1. Fan-out latency: one run emitting 1,000 events/s (each stamped with CLOCK_MONOTONIC at emit)
   to 10 SSE clients, 4 on the owner instance and 3 on each other one; emit -> client p50/p99 of
   the other instances' clients against the owner's (goal: within 2x).
2. Throughput: 30 concurrent runs of `--events` deltas each, created round-robin on the three
   instances, each streamed by a client on the next instance; total events/s (the first creation
   to the last client's terminal event) against the same workload on one instance on
   PostgreSQL (no cluster). The two are alternated `--repeat` times; medians.
3. Takeover: 5 runs on one instance (lease 2 s, heartbeat 0.5 s), SIGKILL it, time until every run
   reads `interrupted` on another instance (goal: within lease + 1 s).

Each measurement uses a fresh PostgreSQL database and its own Redis key prefix.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import click
from _common import ENV, HERE, ROOT, Clients, Gateway, load, median, percentile

POSTGRES_URL = os.environ.get("AG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = "redis://127.0.0.1:6379/0"


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    import psycopg2

    name = "ag_bench_" + secrets.token_hex(6)
    admin = psycopg2.connect(admin_url, connect_timeout=5)
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        yield admin_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def instances(
    storage_url: str,
    redis_url: str | None,
    count: int,
    lease: float = 10.0,
    heartbeat: float = 2.0,
    prefix: str | None = None,
) -> Iterator[list[Gateway]]:
    """`count` instances (redis_url None: one plain instance on PostgreSQL), on Redis key `prefix`
    (default: a fresh one)."""
    prefix = prefix or "agbench:" + secrets.token_hex(4) + ":"
    with contextlib.ExitStack() as stack:
        gateways = []
        for index in range(count):
            data_dir = stack.enter_context(tempfile.TemporaryDirectory())
            argv = [data_dir, storage_url, redis_url or "-", f"gw{index}", prefix, str(lease), str(heartbeat)]
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "_cluster_server.py"), *argv],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=ENV,
            )
            stack.callback(_stop, proc)
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("http"):
                raise RuntimeError("a bench instance did not start")
            gateways.append(Gateway(proc, url, data_dir))
        yield gateways


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def fan_out_latency(admin_url: str, redis_url: str, events: int) -> dict[str, Any]:
    with fresh_database(admin_url) as url, instances(url, redis_url, 3) as gws:
        owner = gws[0]
        run_id = owner.create_run({"events": events, "rate": 1000, "stamp": True, "subscribers": 4})
        remote = [Clients(gw.url, [{"run": run_id}] * 3, mode="latency") for gw in gws[1:]]
        local = Clients(owner.url, [{"run": run_id}] * 4, mode="latency")
        local_results = local.results()
        remote_results = [r for clients in remote for r in clients.results()]
    for result in local_results + remote_results:
        if result["error"] or not result["terminal"]:
            raise RuntimeError(f"client failed: {result['error']}")
    own = [x for r in local_results for x in r["latencies"]]
    other = [x for r in remote_results for x in r["latencies"]]
    return {
        "owner_p50": percentile(own, 50),
        "owner_p99": percentile(own, 99),
        "other_p50": percentile(other, 50),
        "other_p99": percentile(other, 99),
        "events_per_client": min(len(r["latencies"]) for r in local_results + remote_results),
    }


def throughput(admin_url: str, redis_url: str | None, runs: int, events: int) -> float:
    count = 3 if redis_url else 1
    with fresh_database(admin_url) as url, instances(url, redis_url, count) as gws:
        # Each run's client is on the next instance (its events cross Redis), or on the only one;
        # one client process per instance. The clock runs from the first creation, so the rate
        # includes creating the runs and starting the client processes (the same in both).
        start = time.monotonic()
        run_ids = [gws[i % count].create_run({"events": events}) for i in range(runs)]
        readers = [
            Clients(gw.url, [{"run": run_id} for i, run_id in enumerate(run_ids) if (i + 1) % count == index])
            for index, gw in enumerate(gws)
        ]
        results = [r for reader in readers for r in reader.results()]
        elapsed = max(r["done_at"] for r in results) - start
    bad = [r["error"] for r in results if r["error"] or not r["terminal"]]
    if bad or len(results) != runs:
        raise RuntimeError(f"client errors: {bad[:3]}")
    return runs * events / elapsed


def takeover(admin_url: str, redis_url: str, lease: float, heartbeat: float) -> float:
    with fresh_database(admin_url) as url, instances(url, redis_url, 3, lease, heartbeat) as gws:
        victim, survivor = gws[0], gws[1]
        run_ids = [victim.create_run({"events": 100_000, "rate": 200}) for _ in range(5)]
        for run_id in run_ids:  # every run is running before the kill
            deadline = time.monotonic() + 30
            while survivor.get(f"/v1/runs/{run_id}")["status"] != "running":
                if time.monotonic() > deadline:
                    raise TimeoutError(run_id)
                time.sleep(0.01)  # polling from outside
        victim.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.proc.wait()
        for run_id in run_ids:
            while survivor.get(f"/v1/runs/{run_id}")["status"] != "interrupted":
                if time.monotonic() - killed > 60:
                    raise TimeoutError(run_id)
                time.sleep(0.01)  # polling from outside
        return time.monotonic() - killed


@click.command()
@click.option("--repeat", default=2, show_default=True)
@click.option("--events", default=2000, show_default=True, help="Events per run in the 30-run throughput test.")
@click.option("--latency-events", default=5000, show_default=True, help="Events of the 1,000 ev/s fan-out run.")
@click.option("--postgres-url", default=POSTGRES_URL, show_default=True)
@click.option("--redis-url", default=REDIS_URL, show_default=True)
def main(repeat: int, events: int, latency_events: int, postgres_url: str, redis_url: str) -> None:
    print(f"load before: {load()}")
    latencies = [fan_out_latency(postgres_url, redis_url, latency_events) for _ in range(repeat)]
    for item in latencies:
        p50, p99 = item["other_p50"] / item["owner_p50"], item["other_p99"] / item["owner_p99"]
        print(
            f"fan-out 1,000 ev/s: owner p50 {item['owner_p50']:.2f} ms p99 {item['owner_p99']:.2f} ms; "
            f"other instances p50 {item['other_p50']:.2f} ms p99 {item['other_p99']:.2f} ms "
            f"(ratio p50 {p50:.2f}x, p99 {p99:.2f}x)"
        )
    single, cluster = [], []
    for _ in range(repeat):  # alternated, so both see the same load
        single.append(throughput(postgres_url, None, 30, events))
        cluster.append(throughput(postgres_url, redis_url, 30, events))
        print(f"30 runs x {events}: one instance {single[-1]:,.0f} ev/s, three instances {cluster[-1]:,.0f} ev/s")
    print(
        f"throughput median: one instance (PostgreSQL) {median(single):,.0f} ev/s, three instances "
        f"{median(cluster):,.0f} ev/s, ratio {median(cluster) / median(single):.2f}x"
    )
    times = [takeover(postgres_url, redis_url, 2.0, 0.5) for _ in range(repeat)]
    print(f"takeover after SIGKILL (lease 2.0 s, heartbeat 0.5 s): {', '.join(f'{t:.2f} s' for t in times)}")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
