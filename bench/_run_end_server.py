"""`_burst_server.py` with the session indexer timed (bench only; for `bench_run_end.py`).

    BENCH_INDEX_LOG=FILE python bench/_run_end_server.py DATA_DIR

Appends one JSON line to FILE per run that ends: the worker's CPU and wall time in the indexer's
worker call that took the run's end (`SessionIndexer._index_batch`, or `_index_on_writer` on the
journal's writer), the loop's time in the indexer's listener for it (`on_run`), and the loop's CPU
spent folding the run's events as they were published (`_fold`, where the indexer has it; 0
otherwise). Works with any version of the gateway that has those methods, so a baseline checkout
runs under the same timing.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _burst_server

from agent_gateway.routes.sessions import indexer as sessions_indexer

LOG = os.environ["BENCH_INDEX_LOG"]
INDEXER: Any = sessions_indexer.SessionIndexer
_lock = threading.Lock()
_fold_cpu: dict[str, float] = {}
_on_run_ms: dict[str, float] = {}


def _record(line: dict[str, Any]) -> None:
    with _lock, open(LOG, "a") as out:
        out.write(json.dumps(line) + "\n")


def _timed(index: Any) -> Any:
    def timed_index(self: Any, batch: list[Any]) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            index(self, batch)
        finally:
            cpu = time.thread_time() - cpu
            wall = time.perf_counter() - wall
            for run, _source in batch:
                if run.is_terminal:
                    _record(
                        {
                            "run": run.host_run_id,
                            "worker_cpu_ms": cpu * 1000,
                            "worker_wall_ms": wall * 1000,
                            "on_run_ms": _on_run_ms.pop(run.host_run_id, 0.0),
                            "fold_cpu_ms": _fold_cpu.pop(run.host_run_id, 0.0) * 1000,
                        }
                    )

    return timed_index


# The indexer's worker call, and (since 2026-12-07) the same work on the journal's writer for
# runs it folded.
for _name in ("_index_batch", "_index_on_writer"):
    if hasattr(INDEXER, _name):
        setattr(INDEXER, _name, _timed(getattr(INDEXER, _name)))


_on_run = INDEXER.on_run


def timed_on_run(self: Any, run: Any) -> None:
    start = time.perf_counter()
    _on_run(self, run)
    if run.is_terminal:
        _on_run_ms[run.host_run_id] = (time.perf_counter() - start) * 1000


INDEXER.on_run = timed_on_run
_fold = getattr(INDEXER, "_fold", None)
if _fold is not None:

    def timed_fold(self: Any, host_run_id: str, events: list[Any]) -> None:
        cpu = time.thread_time()
        _fold(self, host_run_id, events)
        _fold_cpu[host_run_id] = _fold_cpu.get(host_run_id, 0.0) + time.thread_time() - cpu

    INDEXER._fold = timed_fold

if __name__ == "__main__":
    asyncio.run(_burst_server.main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))
