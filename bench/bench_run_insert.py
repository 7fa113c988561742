"""How long a new run's row takes to store while another run streams into the journal.

    python bench/bench_run_insert.py [--deltas 20000] [--rounds 5]

In one process, with the real SQLite storage: a producer appends `--deltas` text deltas to one
run in bursts (as the chat-only runtime does: 256 events, then it yields), and meanwhile a prober
stores a new run row every few milliseconds and times it. Alternating, in each round:

- before: the row goes to a worker on its own (it competes with the journal's group commits, up
  to `batch_max` events each, for SQLite's writer lock);
- after: the row goes through `Journal.write`, between two group commits bounded by CPU time.

Prints the p50/p99 of the row's store time per mode and the producer's throughput, as same-run
ratios (after over before).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, percentile

from agent_gateway.bus import Bus
from agent_gateway.journal import Journal
from agent_gateway.models import Run
from agent_gateway.plugins.journal_peewee import PeeweeStorage

BURST = 256


def _run_row() -> Run:
    key = secrets.token_hex(6)
    return Run(
        host_run_id="run_" + secrets.token_hex(12),
        request_id=key,
        agent_id="chat-only",
        provider="bench",
        session_id=key,
        actor_id="bench",
        workspace_id="default",
        request={"message": "go", "context": {}, "options": {}},
    )


async def _round(directory: Path, mode: str, deltas: int) -> dict[str, float | list[float]]:
    storage = PeeweeStorage(f"sqlite:///{directory / (mode + secrets.token_hex(3))}.db")
    storage.open()
    executor = ThreadPoolExecutor(4)
    journal = Journal(storage, Bus(), directory / "spool", read_executor=executor)
    if mode == "before":  # group commits of up to batch_max events, as on main
        journal._adapt_commit_limit = lambda count, seconds: None  # type: ignore[method-assign]
    await journal.start()
    loop = asyncio.get_running_loop()
    fast = "run_fast"
    journal.open_run(fast)
    done = asyncio.Event()
    samples: list[float] = []

    async def produce() -> float:
        start = time.perf_counter()
        for index in range(deltas):
            try:
                journal.append_nowait(fast, "message.delta", {"text": "xxxxxxxxxxxxxxxx"}, "bench")
            except Exception:
                await journal.append(fast, "message.delta", {"text": "xxxxxxxxxxxxxxxx"}, "bench")
            if index % BURST == BURST - 1:
                await asyncio.sleep(0)  # the runtime's slice ends
        await journal.flush()
        done.set()
        return deltas / (time.perf_counter() - start)

    async def probe() -> None:
        for _ in range(100_000):
            if done.is_set():
                return
            row = _run_row()
            start = time.perf_counter()
            if mode == "before":
                await loop.run_in_executor(executor, storage.insert_run, row)
            else:
                await journal.write(storage.insert_run, row)
            samples.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(0.005)  # probe pacing

    rate, _ = await asyncio.gather(produce(), probe())
    await journal.close()
    storage.close()
    executor.shutdown()
    return {"rate": rate, "samples": samples}


async def _bench(deltas: int, rounds: int) -> None:
    results: dict[str, dict[str, list[float]]] = {m: {"rate": [], "samples": []} for m in ("before", "after")}
    with tempfile.TemporaryDirectory() as directory:
        for index in range(rounds):
            for mode in ("before", "after") if index % 2 == 0 else ("after", "before"):
                result = await _round(Path(directory), mode, deltas)
                results[mode]["rate"].append(result["rate"])  # type: ignore[arg-type]
                results[mode]["samples"] += result["samples"]  # type: ignore[arg-type]
    summary = {}
    for mode, result in results.items():
        samples, rates = result["samples"], sorted(result["rate"])
        summary[mode] = {
            "n": len(samples),
            "insert_p50_ms": round(percentile(samples, 50), 2),
            "insert_p99_ms": round(percentile(samples, 99), 2),
            "insert_max_ms": round(max(samples), 2),
            "rate": round(rates[len(rates) // 2]),
        }
    before, after = summary["before"], summary["after"]
    summary["after_over_before"] = {
        key: round(after[key] / before[key], 3) for key in ("insert_p50_ms", "insert_p99_ms", "rate")
    }
    print(json.dumps({"deltas": deltas, "rounds": rounds, "load": load(), **summary}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(_bench(args.deltas, args.rounds))


if __name__ == "__main__":
    main()
