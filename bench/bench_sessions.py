"""Session list and search against the raw SQL they issue; the transcript projection against
reading the rows (issue 13, Performance).

    PYTHONPATH=. python bench/bench_sessions.py [--sessions 10000] [--events 1000000]
        [--repeat 200] [--projection-events 100000] [--postgres URL]

Fills a fresh journal (SQLite in a temporary dir, or a fresh schema of the PostgreSQL database at
URL) with ``--sessions`` sessions of one run each and ``--events`` events in all, indexed the way
the gateway indexes them (the run's transcript → its digest → the session row and its search
document). Then, in the same run, for each query:

- **method**: the storage method the API calls (``list_session_index`` / ``search_session_index``);
- **raw SQL**: the exact statement and parameters that method sent, executed on the same
  connection with ``fetchall()``.

p50 and p99 over ``--repeat`` calls, and the ratio method / raw SQL at p50. The projection line
times ``read_events`` of a ``--projection-events`` run against ``read_events`` + the fold.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_gateway.models import Event, Run
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.routes.sessions import run_digest
from agent_gateway.transcript import project_transcript, run_transcript

WORDS = "apple bread cider dough ember fjord grape harbor iris juniper kelp lemon maple nutmeg olive".split()


def run_events(run_id: str, count: int, index: int) -> list[Event]:
    """A plausible run: a mode, a tool call, answer deltas, the final, the terminal."""
    word = WORDS[index % len(WORDS)]
    head = [
        Event(run_id, 1, "run.created", "gateway", {"receipt": {"agentId": "bench"}}),
        Event(run_id, 2, "session.info.updated", "gateway", {"sessionMode": "new_session"}),
        Event(run_id, 3, "tool.started", "bench", {"toolCallId": "c1", "title": f"search {word}", "kind": "search"}),
        Event(run_id, 4, "tool.completed", "bench", {"toolCallId": "c1", "status": "completed", "path": f"{word}.md"}),
    ]
    deltas = [
        Event(run_id, seq, "message.delta", "bench", {"text": f"{word} {seq} "}) for seq in range(5, max(5, count - 1))
    ]
    seq = 5 + len(deltas)
    tail = [
        Event(run_id, seq, "message.completed", "bench", {"text": f"about {word} number {index}"}),
        Event(run_id, seq + 1, "run.completed", "gateway", {"status": "completed"}),
    ]
    return head + deltas + tail


def fill(storage: PeeweeStorage, sessions: int, events: int) -> None:
    per_run = max(6, events // sessions)
    started = time.perf_counter()
    batch: list[Event] = []
    for index in range(sessions):
        run_id = f"run_{index:08d}"
        run = Run(
            host_run_id=run_id,
            request_id="r",
            agent_id="bench",
            provider="bench",
            session_id=f"s{index:08d}",
            actor_id=f"actor{index % 10}",
            workspace_id="w",
            status="completed",
            created_at=1_700_000_000_000 + index,
            updated_at=1_700_000_000_000 + index,
            request={"message": f"question {index} on {WORDS[index % len(WORDS)]}", "options": {}},
        )
        storage.insert_run(run)
        journal = run_events(run_id, per_run, index)
        batch.extend(journal)
        if len(batch) >= 20_000:
            storage.append_events(batch)
            batch = []
        storage.touch_session_index(run)
        storage.put_run_digest(run_digest(run, project_transcript(journal, run_transcript(run))))
        if index and index % 2000 == 0:
            print(f"  {index:>6} sessions in {time.perf_counter() - started:6.1f} s", flush=True)
    storage.append_events(batch)
    print(f"filled {sessions} sessions, ~{per_run * sessions:,} events in {time.perf_counter() - started:.1f} s")


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def capture_sql(storage: PeeweeStorage, call: Callable[[], Any]) -> tuple[str, list[Any], int]:
    """The (last) statement and parameters ``call`` sends through the session index, and how
    many rows ``call`` returns."""
    seen: list[tuple[str, list[Any]]] = []
    original = storage._sql

    def spy(sql: str, params: Any = ()) -> Any:
        seen.append((sql if storage.is_sqlite else sql.replace("?", "%s"), list(params)))
        return original(sql, params)

    storage._sql = spy  # type: ignore[method-assign]
    try:
        rows = len(call())
    finally:
        storage._sql = original  # type: ignore[method-assign]
    return (*seen[-1], rows)


def compare(storage: PeeweeStorage, label: str, call: Callable[[], Any], repeat: int) -> None:
    sql, params, rows = capture_sql(storage, call)

    def raw() -> Any:
        cursor = storage.database.execute_sql(sql, params)
        return cursor.fetchall()

    method_times, raw_times = [], []
    for _ in range(repeat):  # interleaved, so load changes hit both alike
        started = time.perf_counter()
        call()
        method_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        raw()
        raw_times.append(time.perf_counter() - started)
    p50_m, p99_m = percentile(method_times, 0.5), percentile(method_times, 0.99)
    p50_r, p99_r = percentile(raw_times, 0.5), percentile(raw_times, 0.99)
    print(
        f"{label:<30} {rows:>3} rows | method p50 {p50_m * 1000:7.2f} ms p99 {p99_m * 1000:7.2f} ms | "
        f"raw SQL p50 {p50_r * 1000:7.2f} ms p99 {p99_r * 1000:7.2f} ms | ratio {p50_m / p50_r:5.2f}"
    )


def bench_projection(storage: PeeweeStorage, count: int, repeat: int) -> None:
    run_id = "run_projection"
    storage.append_events(run_events(run_id, count, 0))
    reads, folds = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        rows = storage.read_events(run_id)
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        transcript = project_transcript(storage.read_events(run_id))
        folds.append(time.perf_counter() - started)
    assert transcript["status"] == "completed" and len(rows) == count
    read, fold = statistics.median(reads), statistics.median(folds)
    print(
        f"projection of a {count:,}-event run     read {read * 1000:7.1f} ms | read + fold {fold * 1000:7.1f} ms"
        f" | ratio {fold / read:5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--projection-events", type=int, default=100_000)
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL (a fresh schema is used)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.postgres:
            schema = "bench_" + uuid.uuid4().hex[:8]
            storage = PeeweeStorage(args.postgres, schema=schema)
        else:
            storage = PeeweeStorage(f"sqlite:///{Path(tmp) / 'bench.db'}")
        storage.open()
        try:
            fill(storage, args.sessions, args.events)
            actor = "actor3"  # a tenth of the sessions
            first = storage.list_session_index(actor, limit=50)
            last = first[-1]
            after = (last["pinned"], last["updated_at"], last["session_id"])
            compare(storage, "list, first page (50)", lambda: storage.list_session_index(actor, limit=50), args.repeat)
            compare(
                storage,
                "list, next page (keyset)",
                lambda: storage.list_session_index(actor, limit=50, after=after),
                args.repeat,
            )
            compare(
                storage,
                "search, common word (50)",
                lambda: storage.search_session_index(actor, "iris", limit=50),
                args.repeat,
            )
            compare(
                storage,
                "search, rare (a few sessions)",
                lambda: storage.search_session_index(actor, "number 4513", limit=50),
                args.repeat,
            )
            bench_projection(storage, args.projection_events, max(3, args.repeat // 40))
        finally:
            if args.postgres:
                storage.database.execute_sql(f'DROP SCHEMA "{storage.schema}" CASCADE')
            storage.close()


if __name__ == "__main__":
    main()
