"""One 20,000-delta run through the OpenAI-compatible streams against the native run stream
(issue 14, Performance).

    PYTHONPATH=. python bench/bench_openai_compat.py [--deltas 20000] [--rounds 5]

A gateway process (this file with ``--serve``) has a ``burst`` agent that emits ``--deltas``
``message.delta`` events of 16 characters as fast as it can, once a stream is attached (so every
live mode streams the run from its first delta). In the same run, alternating the
modes round by round, one client (this process, a bare ``http.client`` reader) consumes:

- live, a new run each time: the native stream (``POST /v1/runs`` + ``GET /v1/runs/{id}/stream``),
  the chat-completions stream (``POST /v1/chat/completions``, ``stream: true``) and the
  Responses stream (``POST /v1/responses``, ``stream: true``);
- replay, one finished run: the native stream and ``GET /v1/responses/{id}?stream=true`` (the
  projection alone: no agent, no storage writes).

For each: deltas per second (wall, request to end of stream) and the gateway process's CPU per
delta until the journal has stored every event (so each run's storage writes count in its own
sample), all threads and the event loop's thread alone (streams are encoded and written there;
the storage threads' share is the same work in every mode, and the noisiest). Medians over the
rounds, and each projection's ratio to the native stream of the same kind (goal: at most 1.3).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AGENT = "burst"
DELTA_TEXT = "x" * 16
# The gateway is idle when it spends less than this CPU time in 100 ms.
IDLE_CPU_SECONDS = 0.002


# -- the gateway process ----------------------------------------------------------------------------


async def serve(data_dir: str, deltas: int) -> None:
    from aiohttp import web

    from agent_gateway import RuntimePolicy, Turn, TurnOutcome, hookimpl
    from agent_gateway.app import GATEWAY_KEY, create_app
    from agent_gateway.cli import tune_gc_for_serving
    from agent_gateway.config import Config
    from agent_gateway.plugin_host import PluginHost

    class BurstRuntime:
        bus: Any = None  # the gateway's event bus, set once the app is made (to wait for subscribers)

        agent_id = AGENT
        display_name = "Burst (benchmark)"
        provider = "bench"
        policy = RuntimePolicy(context_carrier="none")

        def describe(self) -> dict[str, Any]:
            return {"capabilities": []}

        async def run_turn(self, turn: Turn) -> TurnOutcome:
            # Every mode streams live from the first delta: wait for the stream's subscription.
            bus, topic = BurstRuntime.bus, turn.run.host_run_id
            for _ in range(10_000):
                if bus.subscriber_count(topic):
                    break
                await asyncio.sleep(0.001)  # polling a bench-only precondition
            emit = turn.emit
            for i in range(deltas):
                await emit("message.delta", {"text": DELTA_TEXT})
                if i % 100 == 99:
                    await asyncio.sleep(0)  # let writers run, as a real agent's reads would
            return TurnOutcome("completed")

        async def close(self) -> None:
            pass

    class BurstPlugin:
        @hookimpl
        def register_runtimes(self, register: Any, config: Any) -> None:
            register(BurstRuntime())

    config = Config.load(None, env={}, overrides={"gateway": {"data_dir": data_dir}})
    app = create_app(config, PluginHost.load(env={}, extra=(BurstPlugin(),)))  # openai_compat: its entry point
    BurstRuntime.bus = app[GATEWAY_KEY].bus
    runner = web.AppRunner(app, handle_signals=True, access_log=None)
    await runner.setup()
    tune_gc_for_serving()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"http://127.0.0.1:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


# -- the client ---------------------------------------------------------------------------------------


class Bench:
    def __init__(self, url: str, pid: int) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.pid = pid

    def cpu(self) -> tuple[float, float]:
        """CPU seconds of the gateway process so far: every thread (storage writes and reads too)
        and the event loop's thread alone (where streams are encoded and written), from the
        scheduler's nanosecond counters: /proc/PID/stat's 10 ms ticks are too coarse for one run."""
        total = loop = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                spent = int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a worker thread that just ended
            total += spent
            if task.name == str(self.pid):
                loop = spent
        return total / 1e9, loop / 1e9

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> http.client.HTTPResponse:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=600)
        headers = {"Content-Type": "application/json"}
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
        response = connection.getresponse()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {response.read()[:500]!r}")
        return response

    def drain(self, response: http.client.HTTPResponse) -> int:
        """Read the stream to its end; the number of bytes."""
        total = 0
        while chunk := response.read1(1 << 16):
            total += len(chunk)
        return total

    def new_run(self) -> str:
        body = {"requestId": os.urandom(8).hex(), "agentId": AGENT, "sessionId": os.urandom(6).hex(), "message": "go"}
        data = json.loads(self.request("POST", "/v1/runs", body).read())
        return str(data["hostRunId"])

    # each mode: returns the bytes read
    def native_live(self) -> int:
        return self.drain(self.request("GET", f"/v1/runs/{self.new_run()}/stream"))

    def chat_live(self) -> int:
        body = {"model": AGENT, "messages": [{"role": "user", "content": "go"}], "stream": True}
        return self.drain(self.request("POST", "/v1/chat/completions", body))

    def responses_live(self) -> int:
        return self.drain(self.request("POST", "/v1/responses", {"model": AGENT, "input": "go", "stream": True}))

    def native_replay(self, run_id: str) -> int:
        return self.drain(self.request("GET", f"/v1/runs/{run_id}/stream"))

    def responses_replay(self, run_id: str) -> int:
        return self.drain(self.request("GET", f"/v1/responses/resp_{run_id}?stream=true"))

    def pending_events(self) -> float:
        for line in self.request("GET", "/metrics").read().decode().splitlines():
            if line.startswith("agent_gateway_journal_pending_events "):
                return float(line.split()[-1])
        raise KeyError("agent_gateway_journal_pending_events")

    def settle(self) -> None:
        """Wait until the journal has stored every event and the gateway is idle (the session
        index is updated after a run, off the loop), so a run's work is counted in its own
        sample, not in the next mode's."""
        deadline = time.monotonic() + 120
        while self.pending_events() and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the gateway's metric from outside
        before = self.cpu()[0]
        while time.monotonic() < deadline:
            time.sleep(0.1)  # watching the gateway's CPU from outside
            now = self.cpu()[0]
            if now - before < IDLE_CPU_SECONDS:
                return
            before = now

    def measure(self, consume: Callable[[], int]) -> tuple[float, float, float]:
        """(seconds to the end of the stream, gateway CPU seconds until its events are stored,
        the event loop's share of them)."""
        self.settle()
        (total, loop), start = self.cpu(), time.perf_counter()
        consume()
        seconds = time.perf_counter() - start
        self.settle()
        total_after, loop_after = self.cpu()
        return seconds, total_after - total, loop_after - loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--serve", nargs=2, metavar=("DATA_DIR", "DELTAS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve[0], int(args.serve[1])))
        return
    with tempfile.TemporaryDirectory() as data_dir:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, __file__, "--serve", data_dir, str(args.deltas)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            bench = Bench(url, proc.pid)
            bench.native_live()  # warm-up: imports, first storage writes
            finished = bench.new_run()
            bench.native_replay(finished)  # (waits for that run's end)
            modes: dict[str, Callable[[], int]] = {
                "native stream, live": bench.native_live,
                "chat completions stream, live": bench.chat_live,
                "responses stream, live": bench.responses_live,
                "native stream, replay": lambda: bench.native_replay(finished),
                "responses stream, replay": lambda: bench.responses_replay(finished),
            }
            samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in modes}
            for _ in range(args.rounds):  # alternating: machine noise spreads over every mode
                for name, consume in modes.items():
                    samples[name].append(bench.measure(consume))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"{args.deltas} deltas, median of {args.rounds} alternating rounds; CPU in µs per delta")
    print(f"{'mode':31} {'deltas/s':>9} {'CPU':>6} {'vs native':>10} {'loop CPU':>9} {'vs native':>10}")
    for name, values in samples.items():
        native = "native stream, live" if "live" in name else "native stream, replay"
        seconds, cpu, loop = (statistics.median(v[i] for v in values) for i in range(3))
        native_cpu, native_loop = (statistics.median(v[i] for v in samples[native]) for i in (1, 2))
        print(
            f"{name:31} {args.deltas / seconds:>9,.0f} {cpu / args.deltas * 1e6:>6.1f} {cpu / native_cpu:>9.2f}x"
            f" {loop / args.deltas * 1e6:>9.1f} {loop / native_loop:>9.2f}x"
        )


if __name__ == "__main__":
    main()
