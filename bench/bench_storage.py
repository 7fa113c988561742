"""Append throughput of the peewee journal against raw sqlite3 (DESIGN §9).

    PYTHONPATH=. python bench/bench_storage.py [--events 100000] [--batch 500] [--postgres URL]

Both sides serialise each payload with ``Event.payload_json()`` and commit once per batch in WAL
mode with ``synchronous=NORMAL``; each writes into a fresh temporary file.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from agent_gateway.models import Event
from agent_gateway.plugins.journal_peewee import PeeweeStorage


def make_events(count: int) -> list[Event]:
    return [
        Event("run-bench", seq, "message.delta", "reasonix", {"text": f"token {seq} ", "index": seq}, 1_700_000_000_000)
        for seq in range(1, count + 1)
    ]


def batches(events: list[Event], size: int) -> list[list[Event]]:
    return [events[i : i + size] for i in range(0, len(events), size)]


def timed(label: str, count: int, body: Callable[[], None]) -> float:
    started = time.perf_counter()
    body()
    elapsed = time.perf_counter() - started
    rate = count / elapsed
    print(f"{label:<34} {count:>8} events in {elapsed:6.2f} s = {rate:>9,.0f} events/s")
    return rate


def bench_raw_sqlite(path: Path, chunks: list[list[Event]]) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE events (host_run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, "
        "source TEXT NOT NULL, payload TEXT NOT NULL, created_at INTEGER NOT NULL, "
        "PRIMARY KEY (host_run_id, seq))"
    )
    sql = "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)"
    for chunk in chunks:
        conn.execute("BEGIN")
        conn.executemany(sql, [(e.host_run_id, e.seq, e.kind, e.source, e.payload_json(), e.created_at) for e in chunk])
        conn.execute("COMMIT")
    conn.close()


def bench_storage(storage: PeeweeStorage, chunks: list[list[Event]]) -> None:
    for chunk in chunks:
        storage.append_events(chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--postgres", metavar="URL", help="also time PeeweeStorage on this PostgreSQL URL")
    args = parser.parse_args()
    chunks = batches(make_events(args.events), args.batch)
    print(f"{args.events} events, batches of {args.batch}")

    with tempfile.TemporaryDirectory() as tmp:
        raw = timed("raw sqlite3.executemany", args.events, lambda: bench_raw_sqlite(Path(tmp) / "raw.db", chunks))
        storage = PeeweeStorage(f"sqlite:///{Path(tmp) / 'journal.db'}")
        storage.open()
        try:
            ours = timed("PeeweeStorage.append_events sqlite", args.events, lambda: bench_storage(storage, chunks))
        finally:
            storage.close()
    print(f"ratio PeeweeStorage / raw: {ours / raw:.2f}")

    if args.postgres:
        schema = f"ag_bench_{uuid.uuid4().hex[:8]}"
        storage = PeeweeStorage(args.postgres, schema=schema)
        storage.open()
        try:
            timed("PeeweeStorage.append_events pg", args.events, lambda: bench_storage(storage, chunks))
        finally:
            storage.database.execute_sql(f'DROP SCHEMA "{schema}" CASCADE')
            storage.close()


if __name__ == "__main__":
    main()
