"""Shared pieces of the benchmarks: a gateway in its own process, client processes, baselines."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


class Gateway:
    def __init__(self, proc: subprocess.Popen[str], url: str, data_dir: str) -> None:
        self.proc = proc
        self.url = url
        self.data_dir = data_dir

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> tuple[float, float]:
        """User and system CPU seconds of the gateway process so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / tick, int(fields[12]) / tick

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM (peak) of the gateway process, in KiB."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
        return out

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=60) as response:
            return json.loads(response.read())

    def create_run(self, options: dict[str, Any], session: str | None = None) -> str:
        body = {
            "requestId": os.urandom(8).hex(),
            "agentId": "burst",
            "sessionId": session or os.urandom(4).hex(),
            "message": "go",
            "options": options,
        }
        return self.post("/v1/runs", body)["hostRunId"]

    def wait_run(self, run_id: str, timeout: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            receipt = self.get(f"/v1/runs/{run_id}")
            if receipt["status"] in ("completed", "failed", "cancelled", "interrupted"):
                return receipt
            time.sleep(0.05)  # polling the run's status from outside
        raise TimeoutError(run_id)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.split()[-1])
        raise KeyError(name)

    def committed_at(self) -> float | None:
        """None if nothing was pending at the first look; else when the journal had committed all."""
        if self.metric("agent_gateway_journal_pending_events") == 0:
            return None
        while self.metric("agent_gateway_journal_pending_events") > 0:
            time.sleep(0.005)  # polling the gateway's metric from outside
        return time.monotonic()

    def events(self, run_id: str, after: int = 0, limit: int = 5) -> list[dict[str, Any]]:
        return self.get(f"/v1/runs/{run_id}/events?afterSeq={after}&limit={limit}")["events"]


@contextlib.contextmanager
def gateway(storage_url: str = "") -> Iterator[Gateway]:
    with tempfile.TemporaryDirectory() as data_dir:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "_burst_server.py"), data_dir, storage_url],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=ENV,
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            if not url.startswith("http"):
                raise RuntimeError("the bench gateway did not start")
            yield Gateway(proc, url, data_dir)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


class Clients:
    """SSE clients in `processes` separate processes, the streams dealt round-robin."""

    def __init__(
        self, url: str, streams: list[dict[str, Any]], processes: int = 1, warm: Clients | None = None, **spec: Any
    ) -> None:
        """`warm`: processes started ahead by `Clients.warm` (their count is `processes`), given
        their streams now: their interpreters' start-up is done, and its CPU does not land in
        the run they measure."""
        self.procs = warm.procs if warm is not None else []
        self.stderr_files: list[Any] = warm.stderr_files if warm is not None else []
        for i in range(processes):
            mine = streams[i::processes]
            payload = json.dumps({"url": url, "streams": mine, **spec})
            if warm is not None:
                stdin = self.procs[i].stdin
                assert stdin is not None
                stdin.write(payload + "\n")
                stdin.close()
                continue
            if not mine:
                continue
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(HERE / "_sse_client.py"), payload],
                    stdout=subprocess.PIPE,
                    stderr=self._stderr(),
                    text=True,
                    cwd=ROOT,
                    env=ENV,
                )
            )
        self._expect("ready")  # every connection has its response headers

    @classmethod
    def warm(cls, processes: int = 1) -> Clients:
        """Client processes started and waiting for their streams (`Clients(..., warm=...)`)."""
        clients = cls.__new__(cls)
        clients.stderr_files = []
        clients.procs = [
            subprocess.Popen(
                [sys.executable, str(HERE / "_sse_client.py"), "-"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=clients._stderr(),
                text=True,
                cwd=ROOT,
                env=ENV,
            )
            for _ in range(processes)
        ]
        clients._expect("waiting")
        return clients

    def _expect(self, word: str) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != word:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"client process failed: {line!r} {self._errors()}")

    def _stderr(self) -> Any:
        self.stderr_files.append(tempfile.TemporaryFile("w+"))
        return self.stderr_files[-1]

    def _errors(self) -> str:
        text = ""
        for f in self.stderr_files:
            f.seek(0)
            text += f.read()
        return text[-2000:]

    def results(self, timeout: float = 900) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self.cpu = [0.0, 0.0]  # user, system seconds of the client processes
        for proc in self.procs:
            assert proc.stdout is not None
            stdout = proc.stdout.read()  # (not communicate(): it would miss what readline buffered)
            if proc.wait(timeout=timeout) or not stdout.strip():
                raise RuntimeError(f"client process failed: {self._errors()}")
            result = json.loads(stdout.strip().splitlines()[-1])
            out += result["streams"]
            self.cpu = [a + b for a, b in zip(self.cpu, result["cpu"], strict=True)]
        return out


def raw_sqlite_rate(count: int, batch: int = 500, payload: str = '{"text":"xxxxxxxxxxxxxxxx"}') -> float:
    """Raw sqlite3.executemany, WAL, synchronous=NORMAL, `batch` rows per commit, the journal's row
    shape (rows built beforehand: only executemany + commit is timed)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(os.path.join(tmp, "raw.db"))
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(
            "CREATE TABLE events (host_run_id TEXT, seq INTEGER, kind TEXT, source TEXT, payload TEXT,"
            " created_at INTEGER, PRIMARY KEY (host_run_id, seq))"
        )
        rows = [("run_bench", seq, "message.delta", "burst", payload, 0) for seq in range(1, count + 1)]
        start = time.perf_counter()
        for first in range(0, count, batch):
            db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?)", rows[first : first + batch])
            db.commit()
        elapsed = time.perf_counter() - start
        db.close()
    return count / elapsed


def raw_sqlite_select_rate(count: int) -> float:
    """Raw sqlite3 SELECT of `count` journal-shaped rows by primary key range, pages of 2,000."""
    with tempfile.TemporaryDirectory() as tmp:
        db = sqlite3.connect(os.path.join(tmp, "raw.db"))
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(
            "CREATE TABLE events (host_run_id TEXT, seq INTEGER, kind TEXT, source TEXT, payload TEXT,"
            " created_at INTEGER, PRIMARY KEY (host_run_id, seq))"
        )
        db.executemany(
            "INSERT INTO events VALUES (?,?,?,?,?,?)",
            (
                ("run_bench", seq, "message.delta", "burst", '{"text":"xxxxxxxxxxxxxxxx"}', 0)
                for seq in range(1, count + 1)
            ),
        )
        db.commit()
        start = time.perf_counter()
        after, got = 0, 0
        while True:
            rows = db.execute(
                "SELECT host_run_id, seq, kind, source, payload, created_at FROM events"
                " WHERE host_run_id = ? AND seq > ? ORDER BY seq LIMIT 2000",
                ("run_bench", after),
            ).fetchall()
            if not rows:
                break
            got += len(rows)
            after = rows[-1][1]
        elapsed = time.perf_counter() - start
        db.close()
    return got / elapsed


def median_of(repeat: int, fn: Callable[[], dict[str, Any]], key: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `fn` `repeat` times; the result whose `key` is the median, and all of them."""
    results = [fn() for _ in range(repeat)]
    ordered = sorted(results, key=lambda r: r[key])
    return ordered[len(ordered) // 2], results


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
