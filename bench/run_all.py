"""Run every benchmark of docs/performance.md and print one table of ratios.

    python bench/run_all.py [--quick] [--repeat 3] [--only throughput,latency,...] [--json out.json]

Each row's ratio is measured against a baseline taken in the same invocation on the same machine,
and is the median of `--repeat` repetitions (start-up: of max(5, repeat)). `--quick` runs smaller
workloads as a smoke test; the documented figures come from the full run.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_pipeline
import bench_suite
from _common import load

ORDER = ("throughput", "latency", "memory", "resume", "fanout", "startup")


@click.command()
@click.option("--quick", is_flag=True, help="Smaller workloads (a smoke test).")
@click.option("--repeat", default=3, show_default=True, help="Repetitions per benchmark; medians are reported.")
@click.option("--only", default="", help=f"Comma-separated subset of {', '.join(ORDER)}.")
@click.option("--json", "json_path", default="", help="Also write every repetition's figures here.")
def main(quick: bool, repeat: int, only: str, json_path: str) -> None:
    names = [n.strip() for n in only.split(",") if n.strip()] or list(ORDER)
    unknown = set(names) - set(ORDER)
    if unknown:
        raise click.BadParameter(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    print(f"python {platform.python_version()}, {platform.machine()}, load before: {load()}", flush=True)
    rows = []
    for name in ORDER:
        if name not in names:
            continue
        started = time.monotonic()
        if name == "throughput":
            row = bench_pipeline.run(quick=quick, repeat=repeat)
            row["ratio_name"] = "gateway / raw executemany"
        else:
            row = bench_suite.BENCHMARKS[name](quick, repeat)
        row["seconds"] = time.monotonic() - started
        rows.append(row)
        print(f"  {row['name']}: ratio {row['ratio']:.3f}  ({row['seconds']:.0f} s, load {load()})", flush=True)
    print()
    header = ("benchmark", "baseline", "measured", "ratio")
    table = [(r["name"], r["baseline"], r["measured"], f"{r['ratio']:.3f} ({r['ratio_name']})") for r in rows]
    widths = [max(len(str(line[i])) for line in [header, *table]) for i in range(len(header))]
    for line in [header, tuple("-" * w for w in widths), *table]:
        print(" | ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)))
    print(f"\nload after: {load()}")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
