"""A long session's end of turn, and a search over long sessions: the session index's work, against
a baseline checkout's, in the same invocation.

    python bench/bench_session_turns.py [--turns 1000] [--answer 2000] [--rounds 3]
        [--baseline-python /path/to/venv-of-a-baseline/bin/python]

The peewee journal on SQLite in a temporary directory, driven in-process (no gateway, no HTTP):
one session, `--turns` runs one after the other, each with an answer of `--answer` characters;
for each, `touch_session_index` and `put_run_digest` as the session indexer makes them when a run
ends. Prints the CPU of `put_run_digest` (the thread's) at the 10th, 100th and last turns: the
median of the 10 turns up to each. Then a search: 20 sessions, each one run whose answer is
100,000 characters of prose from a 20-word vocabulary, and `search_session_index` for a page of
20 with the queries `t`, `th` and `kelp` (prefixes match), the median of 3 of each, wall time.
`--baseline-python`: a Python whose `agent_gateway` is the
baseline (another checkout in its own venv) runs the same workload in a child process; the rounds
alternate between the two. The fixture here is the storage itself: the ratio is the whole figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKS = (10, 100)


@contextmanager
def _storage() -> Iterator[Any]:
    """A fresh peewee journal on SQLite in a temporary directory."""
    from agent_gateway.plugins.journal_peewee import PeeweeStorage

    with tempfile.TemporaryDirectory() as data_dir:
        storage = PeeweeStorage(f"sqlite:///{Path(data_dir) / 'journal.db'}")
        storage.open()
        try:
            yield storage
        finally:
            storage.close()


def _ended_run(storage: Any, number: int, session_id: str, question: str, answer: str) -> dict[str, Any]:
    """Store an ended run and its index row, as the indexer does at its end; returns its digest
    (what `put_run_digest` takes), the run's answer `answer`."""
    from agent_gateway.models import Run
    from agent_gateway.routes.sessions.indexer import run_digest

    run = Run(
        host_run_id=f"run_{number:06d}",
        request_id=f"request_{number}",
        agent_id="bench",
        provider="bench",
        session_id=session_id,
        actor_id="bench",
        workspace_id="w",
        status="completed",
        created_at=1_000 + number,
        updated_at=1_000 + number,
        request={"message": question},
    )
    storage.insert_run(run)
    storage.touch_session_index(run)
    transcript = {
        "question": question,
        "answer": {"text": answer, "final": True},
        "tools": [],
        "files": [],
        "citations": [],
        "sessionMode": "fresh",
        "agentSessionId": None,
    }
    return run_digest(run, transcript)


def _turns(turns: int, answer_chars: int) -> dict[str, float]:
    cpu_ms: list[float] = []
    with _storage() as storage:
        for number in range(1, turns + 1):
            answer = (f"word{number} " * answer_chars)[:answer_chars]
            digest = _ended_run(storage, number, "long", f"question {number} about kelp", answer)
            started = time.thread_time()
            storage.put_run_digest(digest)
            cpu_ms.append((time.thread_time() - started) * 1000)
    marks = [m for m in MARKS if m < turns] + [turns]
    return {f"turn_{m}_ms": round(statistics.median(cpu_ms[max(0, m - 10) : m]), 3) for m in marks}


def _search() -> dict[str, float]:
    rng = random.Random(1)
    vocabulary = "the tide turned toward a reef and kelp forests thrived while gulls waited on rocky shores".split()
    found: dict[str, float] = {}
    with _storage() as storage:
        for number in range(20):
            answer = " ".join(rng.choice(vocabulary) for _ in range(17_000))[:100_000]
            storage.put_run_digest(_ended_run(storage, number, f"session_{number}", "tell me about the sea", answer))
        for query in ("t", "th", "kelp"):
            times = []
            for _ in range(3):
                started = time.perf_counter()
                assert len(storage.search_session_index("bench", query, limit=20)) == 20
                times.append((time.perf_counter() - started) * 1000)
            found[f"search_{query}_ms"] = round(statistics.median(times), 2)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--answer", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-python", help="a Python whose agent_gateway is the baseline (its own venv)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps({**_turns(args.turns, args.answer), **_search()}))
        return
    pythons = {"this": sys.executable}
    if args.baseline_python:
        pythons["baseline"] = args.baseline_python
    results: dict[str, list[dict[str, float]]] = {name: [] for name in pythons}
    for index in range(args.rounds):
        for name in pythons if index % 2 == 0 else list(pythons)[::-1]:
            command = [pythons[name], __file__, "--child", "--turns", str(args.turns), "--answer", str(args.answer)]
            # A baseline runs from its own checkout: not from this one's directory, whose editable
            # install's metadata would name this checkout's plugins.
            found = subprocess.run(command, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
            result: dict[str, Any] = json.loads(found.stdout)
            results[name].append(result)
            print(json.dumps({"round": index, "tree": name, **result}), flush=True)
    report: dict[str, Any] = {}
    for name, rows in results.items():
        for key in rows[0]:
            report[f"{name}.{key}"] = round(statistics.median(r[key] for r in rows), 3)
    if "baseline" in results:
        for key in results["this"][0]:
            report[f"{key}.this_over_baseline"] = round(report[f"this.{key}"] / report[f"baseline.{key}"], 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
