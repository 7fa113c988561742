"""Events of one run through a real gateway process to N SSE clients, against raw sqlite3.

    python bench/bench_pipeline.py [--events 100000] [--clients 10] [--repeat 3]

The gateway runs in its own process (`_burst_server.py`, a `burst` runtime emitting deltas as fast
as it can, yielding every 100 events); the SSE clients run in one other process on raw sockets and
count events by their `data:` lines, so they are not the bottleneck (one process needs about 2.5 µs
of CPU per event for all ten streams, a third less than two processes: on a two-core machine the
clients' CPU is taken from the gateway they measure; `--client-processes` changes it). The run
waits until every client is attached, stamps the start (CLOCK_MONOTONIC, system-wide), and the rate
is events / (the later of the last client's terminal event and the journal's last commit, minus the
start): every event spooled before any client sees it, delivered to every client, and committed to
SQLite. The baseline, measured in the same invocation: raw `sqlite3.executemany`, WAL, 500 rows per
commit, rows built beforehand.
"""

from __future__ import annotations

from typing import Any

import click
from _common import Clients, gateway, load, raw_sqlite_rate


def measure(events: int, clients: int, processes: int = 1, storage_url: str = "") -> dict[str, Any]:
    with gateway(storage_url) as gw:
        run_id = gw.create_run({"events": events, "subscribers": clients})
        readers = Clients(gw.url, [{"run": run_id}] * clients, processes=processes)
        results = readers.results()
        committed = gw.committed_at()
        gw.wait_run(run_id)
        head = gw.events(run_id, 0, 10)
        t0 = next(e["payload"]["t0"] for e in head if e["kind"] == "plan.updated")
        tail = gw.events(run_id, events, 20)
        total = int(tail[-1]["seq"])
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        raise RuntimeError(f"client errors: {errors[:3]}")
    delivered = max(r["done_at"] for r in results)
    end = max(delivered, committed or 0.0)  # every client has every event, and storage has it too
    elapsed = end - t0
    received = min(r["events"] for r in results)
    return {
        "rate": events / elapsed,
        "delivered_rate": events / (delivered - t0),
        "elapsed": elapsed,
        "client_cpu_us_per_event": 1e6 * sum(readers.cpu) / events,
        "received_min": received,
        "total": total,
        "merged": total - received,  # 0: every client got every event, none merged
    }


def run(quick: bool = False, repeat: int = 3, events: int | None = None, clients: int = 10) -> dict[str, Any]:
    events = events or (20_000 if quick else 100_000)
    raws, gws = [], []
    for _ in range(repeat):  # interleaved, so both see the same load
        raws.append(raw_sqlite_rate(events))
        gws.append(measure(events, clients))
    raw = sorted(raws)[len(raws) // 2]
    best = sorted(gws, key=lambda r: r["rate"])[len(gws) // 2]
    return {
        "name": f"1. throughput, 1 run -> {clients} SSE clients",
        "baseline": f"raw executemany {raw:,.0f} ev/s",
        "measured": f"gateway {best['rate']:,.0f} ev/s (merged {best['merged']})",
        "ratio": best["rate"] / raw,
        "detail": {"raw": raws, "gateway": gws, "load": load()},
    }


@click.command()
@click.option("--events", default=100_000, show_default=True)
@click.option("--clients", default=10, show_default=True)
@click.option("--repeat", default=3, show_default=True)
@click.option("--storage-url", default="", help="Default: SQLite in a temp data dir.")
@click.option("--client-processes", default=1, show_default=True, help="Processes the SSE clients are spread over.")
def main(events: int, clients: int, repeat: int, storage_url: str, client_processes: int) -> None:
    raws, gws = [], []
    for _ in range(repeat):
        raws.append(raw_sqlite_rate(events))
        gws.append(measure(events, clients, client_processes, storage_url))
        print(
            f"raw {raws[-1]:,.0f} ev/s   gateway {gws[-1]['rate']:,.0f} ev/s "
            f"({gws[-1]['elapsed']:.2f} s, merged {gws[-1]['merged']}, "
            f"clients {gws[-1]['client_cpu_us_per_event']:.1f} µs CPU/event)   load {load()}",
            flush=True,
        )
    raw = sorted(raws)[len(raws) // 2]
    gw = sorted(gws, key=lambda r: r["rate"])[len(gws) // 2]
    print(f"events={events} clients={clients} repeat={repeat} (medians)")
    print(f"raw sqlite3.executemany (WAL, 500/commit): {raw:,.0f} events/s")
    print(
        f"gateway, journalled, to {clients} SSE clients: {gw['rate']:,.0f} events/s "
        f"(every client got >= {gw['received_min']:,} of {gw['total']:,} events)"
    )
    print(f"ratio gateway/raw: {gw['rate'] / raw:.2f}")


if __name__ == "__main__":
    main()
