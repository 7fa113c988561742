"""One 20,000-delta run consumed through the AG-UI stream against the native stream, same run.

    python bench/bench_ag_ui.py [--events 20000] [--repeat 5]

The gateway runs in its own process (`_burst_server.py`, the `burst` runtime, with every built-in
plugin loaded through its entry point, the AG-UI plugin among them). One run of N deltas is
recorded; then the same run is read whole, alternately, through `GET /v1/runs/{id}/stream` (the
native stream: the events' cached wire frames) and `GET /v1/ag-ui/runs/{id}/stream` (each event
translated into AG-UI events built with the `ag_ui` models and the official encoder). For each
sample (`--reads` reads of one stream, as /proc counts CPU in 10 ms ticks): wall time per read, the
gateway process's CPU seconds per read (user + system, from /proc), frames received.
Reported: events/s and gateway CPU µs per journal event of each stream, and the AG-UI / native
ratios of the medians (goal: CPU ratio ≤ 1.3).
"""

from __future__ import annotations

import http.client
import statistics
import time
import urllib.parse
from typing import Any

import click
from _common import gateway


def read_stream(url: str, path: str) -> tuple[float, int]:
    """Wall seconds to read the whole stream at `path`, and its `data:` frames."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    start = time.perf_counter()
    connection.request("GET", path, headers={"Accept": "text/event-stream"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{path}: HTTP {response.status} {response.read()[:200]!r}")
    frames, tail = 0, b""
    while True:
        chunk = response.read1(1 << 16)
        if not chunk:
            break
        window = tail + chunk  # a `data:` line may start in one chunk and end in the next
        frames += window.count(b"\ndata: ")
        tail = window[-6:]
    elapsed = time.perf_counter() - start
    connection.close()
    return elapsed, frames


def measure(events: int, repeat: int, reads_per_sample: int) -> dict[str, Any]:
    with gateway() as gw:
        run_id = gw.create_run({"events": events})
        gw.wait_run(run_id)
        total = int(gw.events(run_id, events, 20)[-1]["seq"])
        paths = {"native": f"/v1/runs/{run_id}/stream", "ag-ui": f"/v1/ag-ui/runs/{run_id}/stream"}
        samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in paths}
        read_stream(gw.url, paths["native"])  # warm the journal pages and the code paths once each
        read_stream(gw.url, paths["ag-ui"])
        for _ in range(repeat):
            for name, path in paths.items():  # alternating, so drift hits both alike
                user, system = gw.cpu()
                reads = [read_stream(gw.url, path) for _ in range(reads_per_sample)]
                user2, system2 = gw.cpu()
                cpu = ((user2 - user) + (system2 - system)) / reads_per_sample
                samples[name].append((sum(r[0] for r in reads) / reads_per_sample, cpu, reads[0][1]))
    out: dict[str, Any] = {"events": total}
    for name, rows in samples.items():
        out[name] = {
            "events_per_s": total / statistics.median(r[0] for r in rows),
            "cpu_us_per_event": statistics.median(r[1] for r in rows) / total * 1e6,
            "frames": rows[0][2],
        }
    out["wall_ratio"] = out["native"]["events_per_s"] / out["ag-ui"]["events_per_s"]
    out["cpu_ratio"] = out["ag-ui"]["cpu_us_per_event"] / out["native"]["cpu_us_per_event"]
    return out


@click.command()
@click.option("--events", default=20_000, show_default=True)
@click.option("--repeat", default=5, show_default=True)
@click.option("--reads", default=5, show_default=True, help="reads per sample (CPU ticks are 10 ms)")
def main(events: int, repeat: int, reads: int) -> None:
    result = measure(events, repeat, reads)
    print(f"one run, {result['events']} journal events ({events} deltas), median of {repeat} alternating reads")
    for name in ("native", "ag-ui"):
        row = result[name]
        print(
            f"  {name:7s} {row['events_per_s']:>10,.0f} events/s  {row['cpu_us_per_event']:6.2f} µs CPU/event  "
            f"{row['frames']} frames"
        )
    print(f"  AG-UI / native: wall {result['wall_ratio']:.2f}x, gateway CPU {result['cpu_ratio']:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
