"""Events of one run through a real gateway process to N SSE clients, against raw sqlite3.

    python bench/bench_pipeline.py --events 100000 --clients 10

Both figures come from the same run on the same machine; the ratio is what to compare.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import click

HERE = Path(__file__).resolve().parent


def raw_sqlite_rate(count: int, batch: int = 500) -> float:
    """Raw sqlite3.executemany, WAL, `batch` rows per commit, the journal's row shape."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(os.path.join(tmp, "raw.db"))
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE events (host_run_id TEXT, seq INTEGER, kind TEXT, source TEXT, payload TEXT,"
            " created_at INTEGER, PRIMARY KEY (host_run_id, seq))"
        )
        start = time.perf_counter()
        for first in range(0, count, batch):
            rows = [
                ("run_bench", seq, "message.delta", "burst", json.dumps({"text": "x" * 16}), 0)
                for seq in range(first + 1, min(first + batch, count) + 1)
            ]
            db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?)", rows)
            db.commit()
        elapsed = time.perf_counter() - start
        db.close()
    return count / elapsed


async def consume(http: aiohttp.ClientSession, url: str, run_id: str, ready: asyncio.Event, counts: list[int]) -> float:
    """Count events by their `id:` lines, reading raw chunks (cheap on the client side)."""
    received = 0
    tail = b""
    async with http.get(f"{url}/v1/runs/{run_id}/stream", timeout=aiohttp.ClientTimeout(total=600)) as response:
        ready.set()
        async for chunk in response.content.iter_any():
            data = tail + chunk
            received += data.count(b"\nid: ") + (1 if data.startswith(b"id: ") and not tail else 0)
            tail = data[-8:]
            received -= tail.count(b"\nid: ")
            if b"event: run.completed" in data or b"event: run.failed" in data:
                break
    counts.append(received)
    return time.perf_counter()


async def through_gateway(url: str, events: int, clients: int) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        body = {"requestId": os.urandom(6).hex(), "agentId": "burst", "sessionId": "bench",
                "message": "go", "options": {"events": events}}
        # Subscribe before the run emits: create it with a queued twin so clients can attach first.
        async with http.post(f"{url}/v1/runs", json=body) as response:
            run_id = (await response.json())["hostRunId"]
        start = time.perf_counter()
        counts: list[int] = []
        readies = [asyncio.Event() for _ in range(clients)]
        tasks = [asyncio.create_task(consume(http, url, run_id, readies[i], counts)) for i in range(clients)]
        ends = await asyncio.gather(*tasks)
        elapsed = max(ends) - start
        async with http.get(f"{url}/v1/runs/{run_id}/events", params={"afterSeq": "0", "limit": "1"}) as r:
            await r.json()
        return {"elapsed": elapsed, "rate": events / elapsed, "received_min": min(counts)}


@click.command()
@click.option("--events", default=100_000, show_default=True)
@click.option("--clients", default=10, show_default=True)
@click.option("--storage-url", default="", help="Default: SQLite in a temp data dir.")
def main(events: int, clients: int, storage_url: str) -> None:
    raw = raw_sqlite_rate(events)
    with tempfile.TemporaryDirectory() as data_dir:
        server = subprocess.Popen(
            [sys.executable, str(HERE / "_burst_server.py"), data_dir, storage_url],
            stdout=subprocess.PIPE, text=True, cwd=HERE.parent,
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            result = asyncio.run(through_gateway(url, events, clients))
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"events={events} clients={clients}")
    print(f"raw sqlite3.executemany (WAL, 500/commit): {raw:,.0f} events/s")
    print(f"gateway, journalled, to {clients} SSE clients: {result['rate']:,.0f} events/s "
          f"({result['elapsed']:.2f} s; every client got >= {result['received_min']:,} events)")
    print(f"ratio gateway/raw: {result['rate'] / raw:.2f}")


if __name__ == "__main__":
    main()
