"""Disk per event before and after compaction, what compaction and retention cost, and what a
compaction does to a run streaming at the same time (issue 15, point 4).

    PYTHONPATH=. python bench/bench_disk.py [--runs 5] [--deltas 20000] [--rounds 3]
    PYTHONPATH=. python bench/bench_disk.py --postgres postgresql://postgres@127.0.0.1:5432/test

Workload: ``--runs`` ended runs shaped like a chat-only answer (run.started, ``--deltas``
message.delta events of a few characters, message.completed with the whole text, run.completed).

- Bytes per event. Baseline: the same rows in a plain table (the journal's columns, no index
  but the primary key; SQLite: file size after VACUUM; PostgreSQL: ``pg_total_relation_size``
  after ``VACUUM FULL``). Then the journal's tables before and after ``compact_run`` (and a
  VACUUM / VACUUM FULL, which is what gives the pages back to the file system).
- Compaction cost: ms per 1,000 stored events compacted; retention cost: ms per 1,000 events
  deleted through ``delete_run_history`` (2,000 per step, as the gateway does).
- Effect on a streaming run: a writer thread appends a run's events in batches of 256 (as the
  journal's group commit does) while another thread compacts the ended runs; its throughput and
  p99 commit latency against the same writer alone, in alternating rounds of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_gateway.models import Event, Run
from agent_gateway.plugins.journal_peewee import PeeweeStorage

STREAM_BATCH = 256


def tokens(count: int, seed: str) -> list[str]:
    """Tokens of 1 to 7 letters and a space from a seeded random source: text that does not
    compress much better than a real answer (a repeated phrase would, in PostgreSQL's TOAST)."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase
    return ["".join(rng.choices(letters, k=rng.randint(1, 7))) + " " for _ in range(count)]


def run_events(host_run_id: str, deltas: int, created_at: int = 1_700_000_000_000) -> list[Event]:
    events = [Event(host_run_id, 1, "run.started", "gateway", {}, created_at)]
    texts = tokens(deltas, host_run_id)
    events += [
        Event(host_run_id, seq, "message.delta", "chat-only", {"text": text}, created_at + seq)
        for seq, text in enumerate(texts, start=2)
    ]
    seq = len(events) + 1
    events.append(Event(host_run_id, seq, "message.completed", "chat-only", {"text": "".join(texts)}, created_at + seq))
    events.append(Event(host_run_id, seq + 1, "run.completed", "gateway", {}, created_at + seq + 1))
    return events


def insert_run(storage: PeeweeStorage, host_run_id: str, status: str = "completed") -> None:
    storage.insert_run(
        Run(host_run_id, "req-" + host_run_id, "chat-only", "p", "s-" + host_run_id, "bench", "w", status=status)
    )


def append(storage: PeeweeStorage, events: list[Event], batch: int = 5000) -> None:
    for start in range(0, len(events), batch):
        storage.append_events(events[start : start + batch])


# -- sizes ---------------------------------------------------------------------------------------


def sqlite_file_bytes(storage: PeeweeStorage) -> int:
    storage.database.execute_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    storage.database.execute_sql("VACUUM")
    page_count = storage.database.execute_sql("PRAGMA page_count").fetchone()[0]
    page_size = storage.database.execute_sql("PRAGMA page_size").fetchone()[0]
    return int(page_count * page_size)


def pg_tables_bytes(storage: PeeweeStorage, tables: list[str]) -> int:
    total = 0
    connection = storage.database.connection()
    connection.commit()
    connection.autocommit = True  # VACUUM cannot run inside a transaction
    try:
        with connection.cursor() as cursor:
            for table in tables:
                qualified = storage._qualified(table)
                cursor.execute(f"VACUUM FULL {qualified}")
                cursor.execute(f"SELECT pg_total_relation_size('{qualified}')")
                total += cursor.fetchone()[0]
    finally:
        connection.autocommit = False
    return int(total)


def journal_bytes(storage: PeeweeStorage, empty: int) -> int:
    """Bytes the events (and spans) take: the database's size less its size with no events."""
    if storage.is_sqlite:
        return sqlite_file_bytes(storage) - empty
    return pg_tables_bytes(storage, [f"{storage.table_prefix}events", f"{storage.table_prefix}event_spans"])


def plain_table_bytes(storage: PeeweeStorage, events: list[Event]) -> int:
    """The baseline: the same rows in a plain table with the journal's columns."""
    table = storage._qualified("plain_events")
    p = "?" if storage.is_sqlite else "%s"
    storage.database.execute_sql(
        f"CREATE TABLE {table} (host_run_id TEXT NOT NULL, seq BIGINT NOT NULL, kind TEXT NOT NULL,"
        " source TEXT NOT NULL, payload TEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (host_run_id, seq))"
    )
    if storage.is_sqlite:
        before = sqlite_file_bytes(storage)
    rows = [(e.host_run_id, e.seq, e.kind, e.source, e.payload_json(), e.created_at) for e in events]
    with storage.database.atomic():
        cursor = storage.database.cursor()
        cursor.executemany(f"INSERT INTO {table} VALUES ({', '.join([p] * 6)})", rows)
    if storage.is_sqlite:
        size = sqlite_file_bytes(storage) - before
    else:
        size = pg_tables_bytes(storage, ["plain_events"])
    storage.database.execute_sql(f"DROP TABLE {table}")
    return size


# -- a streaming run next to a compaction ------------------------------------------------------------


def stream(storage: PeeweeStorage, host_run_id: str, deltas: int, latencies: list[float], rates: list[float]) -> None:
    """Append one run's events in group-commit batches as fast as storage takes them; adds the
    events/s to `rates`."""
    events = run_events(host_run_id, deltas)
    started = time.perf_counter()
    for start in range(0, len(events), STREAM_BATCH):
        t0 = time.perf_counter()
        storage.append_events(events[start : start + STREAM_BATCH])
        latencies.append(time.perf_counter() - t0)
    rates.append(len(events) / (time.perf_counter() - started))


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else values[0]


def measure(url: str, schema: str | None, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        if url.startswith("sqlite"):
            url = f"sqlite:///{Path(tmp) / 'journal.db'}"
        storage = PeeweeStorage(url, schema=schema)
        storage.open()
        try:
            return measure_on(storage, args)
        finally:
            if schema:
                storage.database.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
            storage.close()


def measure_on(storage: PeeweeStorage, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    empty = sqlite_file_bytes(storage) if storage.is_sqlite else 0
    runs = [f"run-{i}-{uuid.uuid4().hex[:6]}" for i in range(args.runs)]
    all_events: list[Event] = []
    for host_run_id in runs:
        insert_run(storage, host_run_id)
        events = run_events(host_run_id, args.deltas)
        all_events += events
        append(storage, events)
    count = len(all_events)
    out["events"] = count
    out["payload_bytes"] = sum(len(e.payload_bytes()) for e in all_events) / count
    out["plain"] = plain_table_bytes(storage, all_events) / count
    out["before"] = journal_bytes(storage, empty) / count

    # Compaction, with and without a streaming run next to it (alternating rounds).
    compact_ms: list[float] = []
    alone: list[tuple[float, float]] = []
    beside: list[tuple[float, float]] = []
    for round_number in range(args.rounds):
        for with_compaction in (False, True) if round_number % 2 == 0 else (True, False):
            stream_run = f"stream-{uuid.uuid4().hex[:8]}"
            insert_run(storage, stream_run, status="running")
            latencies: list[float] = []
            rate_box: list[float] = []
            writer = threading.Thread(target=stream, args=(storage, stream_run, args.deltas, latencies, rate_box))
            if with_compaction:
                # Fresh copies of the ended runs to compact (compacted ones have nothing left to fold).
                targets = []
                for i in range(args.runs):
                    target = f"compact-{round_number}-{i}-{uuid.uuid4().hex[:6]}"
                    insert_run(storage, target)
                    append(storage, run_events(target, args.deltas))
                    targets.append(target)
                started = threading.Event()

                def compact_all(targets: list[str] = targets, started: threading.Event = started) -> None:
                    started.set()
                    t0 = time.perf_counter()
                    stored = sum(storage.compact_run(target, args.stretch)[0] for target in targets)
                    compact_ms.append((time.perf_counter() - t0) * 1000 / stored * 1000)

                compactor = threading.Thread(target=compact_all)
                compactor.start()
                started.wait()
                writer.start()
                writer.join()
                compactor.join()
                beside.append((rate_box[0], p99(latencies) * 1000))
            else:
                writer.start()
                writer.join()
                alone.append((rate_box[0], p99(latencies) * 1000))
    out["compact_ms_per_1000"] = statistics.median(compact_ms)
    out["stream_alone"] = (statistics.median(r for r, _ in alone), statistics.median(p for _, p in alone))
    out["stream_beside"] = (statistics.median(r for r, _ in beside), statistics.median(p for _, p in beside))

    # Only the first runs (compacted now) count for the size after.
    for host_run_id in runs:
        storage.compact_run(host_run_id, args.stretch)
    others = [
        r
        for (r,) in storage.database.execute_sql(
            f"SELECT host_run_id FROM {storage._qualified(storage.models.run._meta.table_name)}"
        ).fetchall()
        if r not in runs
    ]
    t0 = time.perf_counter()
    deleted_events = 0
    far_future = 4_000_000_000_000
    for host_run_id in others:
        deleted_events += storage.database.execute_sql(
            f"SELECT COUNT(*) FROM {storage._qualified(storage.models.event._meta.table_name)} WHERE host_run_id = "
            + ("?" if storage.is_sqlite else "%s"),
            (host_run_id,),
        ).fetchone()[0]
        storage.update_run(host_run_id, status="completed", updated_at=1)
        for _ in range(10_000):  # bounded: 2,000 events per step
            if storage.delete_run_history(host_run_id, far_future, 2000):
                break
    out["retention_ms_per_1000"] = (time.perf_counter() - t0) * 1000 / max(deleted_events, 1) * 1000
    out["after"] = journal_bytes(storage, empty) / count
    return out


# -- through a gateway: a run streaming while the previous run is compacted ------------------------------


async def serve(data_dir: str, compact: bool, storage_url: str) -> None:
    """A gateway process with the benchmarks' `burst` runtime (bench/_burst_server.py)."""
    from _burst_server import BurstPlugin  # bench/ is on the path of the serving process
    from aiohttp import web

    from agent_gateway.app import create_app
    from agent_gateway.config import Config
    from agent_gateway.plugin_host import PluginHost

    storage: dict[str, Any] = {"compact_after_terminal": compact}
    if storage_url:
        storage["url"] = storage_url
    config = Config.load(None, env={}, overrides={"gateway": {"data_dir": data_dir}, "storage": storage})
    runner = web.AppRunner(create_app(config, PluginHost.load(env={}, extra=(BurstPlugin(),))), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", flush=True)  # type: ignore[union-attr]
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def gateway_process(compact: bool, storage_url: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", data_dir, "1" if compact else "0", storage_url],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": f"{Path(__file__).parent.parent}:{Path(__file__).parent}"},
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("http"):
                raise RuntimeError("the bench gateway did not start")
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def post_run(url: str, deltas: int) -> str:
    body = {
        "requestId": uuid.uuid4().hex,
        "agentId": "burst",
        "sessionId": uuid.uuid4().hex[:8],
        "message": "go",
        "options": {"events": deltas, "chars": 5},
    }
    request = urllib.request.Request(
        url + "/v1/runs", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["hostRunId"])


def stream_to_end(url: str, run_id: str) -> int:
    """Read a run's SSE stream until its terminal event; the bytes read."""
    total = 0
    tail = b""
    with urllib.request.urlopen(f"{url}/v1/runs/{run_id}/stream", timeout=120) as response:
        while True:
            chunk = response.read1(1 << 16)
            if not chunk:
                return total
            total += len(chunk)
            if b"event: run." in tail + chunk and b"event: run.completed" in tail + chunk:
                return total
            tail = chunk[-64:]


def probe_health(url: str, stop: threading.Event, latencies: list[float]) -> None:
    for _ in range(100_000):  # bounded; ends when the streaming run does
        if stop.is_set():
            return
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "/v1/health", timeout=60) as response:
            response.read()
        latencies.append(time.perf_counter() - t0)
        stop.wait(0.01)  # the probe's pace, not synchronisation


def one_round(url: str, deltas: int) -> tuple[float, float]:
    """Run A to its end, then at once run B with a client reading it: B's events/s at the client
    and the p99 of /v1/health while B streams (A is being compacted meanwhile when enabled)."""
    stream_to_end(url, post_run(url, deltas))
    latencies: list[float] = []
    stop = threading.Event()
    prober = threading.Thread(target=probe_health, args=(url, stop, latencies))
    t0 = time.perf_counter()
    run_id = post_run(url, deltas)
    prober.start()
    stream_to_end(url, run_id)
    elapsed = time.perf_counter() - t0
    stop.set()
    prober.join()
    return deltas / elapsed, p99(latencies) * 1000


def measure_gateway(storage_url: str, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with gateway_process(False, storage_url) as plain, gateway_process(True, storage_url) as compacting:
        for round_number in range(args.gateway_rounds):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            for compact in order:
                results[compact].append(one_round(compacting if compact else plain, args.deltas))
    return {
        ("compacting" if compact else "plain"): (
            statistics.median(rate for rate, _ in rows),
            statistics.median(lag for _, lag in rows),
        )
        for compact, rows in results.items()
    }


def report_gateway(name: str, result: dict[str, tuple[float, float]]) -> None:
    plain_rate, plain_p99 = result["plain"]
    rate, lag = result["compacting"]
    print(f"-- {name}, through a gateway: a run streaming while the run before it is compacted")
    print(f"compaction off (baseline)     {plain_rate:9,.0f} events/s at the client, health p99 {plain_p99:6.2f} ms")
    print(
        f"compaction on                 {rate:9,.0f} events/s at the client, health p99 {lag:6.2f} ms"
        f"  ratio {rate / plain_rate:.2f} (throughput), {lag / plain_p99:.2f} (health p99)"
    )


def report(name: str, result: dict[str, Any]) -> None:
    plain, before, after = result["plain"], result["before"], result["after"]
    alone_rate, alone_p99 = result["stream_alone"]
    beside_rate, beside_p99 = result["stream_beside"]
    print(f"== {name}: {result['events']:,} events (payload JSON {result['payload_bytes']:.1f} B/event)")
    print(f"plain table (baseline)        {plain:7.1f} B/event")
    print(f"journal before compaction     {before:7.1f} B/event  ratio to plain {before / plain:.2f}")
    print(f"journal after compaction      {after:7.1f} B/event  ratio to plain {after / plain:.3f}")
    print(f"compaction                    {result['compact_ms_per_1000']:7.2f} ms per 1,000 stored events")
    print(f"retention (delete)            {result['retention_ms_per_1000']:7.2f} ms per 1,000 events")
    print(f"streaming run alone           {alone_rate:9,.0f} events/s, p99 commit {alone_p99:6.2f} ms")
    print(
        f"streaming run beside compact  {beside_rate:9,.0f} events/s, p99 commit {beside_p99:6.2f} ms"
        f"  ratio {beside_rate / alone_rate:.2f} (throughput), {beside_p99 / alone_p99:.2f} (p99)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--stretch", type=int, default=4096, help="most deltas per compacted event")
    parser.add_argument("--gateway-rounds", type=int, default=6, help="rounds through a gateway (0: none)")
    parser.add_argument("--postgres", metavar="URL", help="also measure on this PostgreSQL URL")
    parser.add_argument("--serve", nargs=3, metavar=("DATA_DIR", "COMPACT", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        data_dir, compact, storage_url = args.serve
        asyncio.run(serve(data_dir, compact == "1", storage_url))
        return
    report("SQLite", measure("sqlite", None, args))
    if args.gateway_rounds:
        report_gateway("SQLite", measure_gateway("", args))
    if args.postgres:
        report("PostgreSQL", measure(args.postgres, f"ag_bench_{uuid.uuid4().hex[:8]}", args))
        if args.gateway_rounds:
            schema = f"ag_bench_gw_{uuid.uuid4().hex[:8]}"
            url = f"{args.postgres}{'&' if '?' in args.postgres else '?'}options=-csearch_path%3D{schema}"
            admin = PeeweeStorage(args.postgres, schema=schema)
            admin.open()  # creates the schema both gateways then share
            try:
                report_gateway("PostgreSQL", measure_gateway(url, args))
            finally:
                admin.database.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
                admin.close()


if __name__ == "__main__":
    main()
