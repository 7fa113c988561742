"""The gateway side by side with a bare upstream client and with LangGraph's API server.

    python bench/bench_compare.py [--deltas 5000] [--rounds 5] [--langgraph /path/to/venv/bin/langgraph]

One workload: a chat turn whose model streams `--deltas` pieces of 16 characters from the fake
OpenAI-compatible upstream (`agent_gateway.testing.fake_openai`, in its own process). One client
(this process: aiohttp, every SSE `data:` line parsed with `json.loads`, the streamed text checked
whole) reads it:

- `bare`: straight from the upstream (`POST /v1/chat/completions`, `stream: true`): what the
  fixture itself delivers, the ceiling;
- `gateway-openai`: through the gateway (`agent-gateway serve`, SQLite, agent `chat-only`), its
  OpenAI-compatible endpoint, the same request with `model: chat-only`;
- `gateway-native`: through the gateway, `POST /v1/runs` then `GET /v1/runs/{id}/stream`;
- `langgraph`: through LangGraph's API server (`langgraph dev --no-reload`, its in-memory
  runtime), a one-node graph calling the same upstream with LangChain's `ChatOpenAI`, read with
  `POST /threads/{id}/runs/stream` and `stream_mode: messages-tuple` (LangGraph's way to stream a
  model's tokens). Skipped, with the reason printed, unless `--langgraph` (or `$LANGGRAPH_BIN`)
  names a `langgraph` executable whose environment has `langgraph-cli[inmem]` and
  `langchain-openai` (install them in a venv of their own: they are not this project's
  dependencies).

Rounds interleave the modes; medians of deltas/s (request to the end of the stream), the first
piece of text after the request, and the server's CPU per delta (the gateway's or LangGraph's
process tree; the upstream's own for `bare`), each also as a ratio to the bare client's figure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import click

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PIECE = 16  # characters per streamed piece


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid` and its descendants, every thread, from the scheduler's nanosecond
    counters (a server may fork workers; /proc/PID/stat's 10 ms ticks are too coarse for a run)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
    wanted = {pid}
    for _ in range(64):  # descendants, level by level (bounded depth)
        children = {child for child, parent in parents.items() if parent in wanted and child not in wanted}
        if not children:
            break
        wanted |= children
    total = 0
    for item in wanted:
        try:
            tasks = list(Path(f"/proc/{item}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            continue
        for task in tasks:
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that just ended
    return total / 1e9


class Server:
    def __init__(self, name: str, argv: list[str], url: str, env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.url = url
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd)

    async def wait_ready(self, path: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.output()}")
                try:
                    async with session.get(self.url + path) as response:
                        if response.status < 500:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)  # polling a starting server from outside
        raise TimeoutError(f"{self.name} did not start: {self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def cpu(self) -> float:
        return tree_cpu(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def sse_data(response: aiohttp.ClientResponse) -> Any:
    """Each SSE frame's (event, parsed data); `[DONE]` ends."""
    event = ""
    async for raw in response.content:
        line = raw.rstrip(b"\r\n")
        if line.startswith(b"event:"):
            event = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            yield event, json.loads(data)
        elif not line:
            event = ""


class Mode:
    """One way of reading the workload: `stream(session)` yields each piece of text as it arrives."""

    def __init__(self, name: str, server: Server, read: Callable[[aiohttp.ClientSession], Any]) -> None:
        self.name = name
        self.server = server
        self.read = read


def chat_reader(base: str, model: str) -> Callable[[aiohttp.ClientSession], Any]:
    async def read(session: aiohttp.ClientSession) -> Any:
        body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        async with session.post(base + "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for _, chunk in sse_data(response):
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        yield text

    return read


def native_reader(base: str) -> Callable[[aiohttp.ClientSession], Any]:
    async def read(session: aiohttp.ClientSession) -> Any:
        body = {"requestId": os.urandom(8).hex(), "agentId": "chat-only", "sessionId": os.urandom(6).hex()}
        async with session.post(base + "/v1/runs", json={**body, "message": "go"}) as response:
            response.raise_for_status()
            run_id = (await response.json())["hostRunId"]
        async with session.get(f"{base}/v1/runs/{run_id}/stream") as response:
            response.raise_for_status()
            async for event, data in sse_data(response):
                if event == "message.delta":
                    yield data["payload"]["text"]

    return read


def langgraph_reader(base: str) -> Callable[[aiohttp.ClientSession], Any]:
    async def read(session: aiohttp.ClientSession) -> Any:
        async with session.post(base + "/threads", json={}) as response:
            response.raise_for_status()
            thread = (await response.json())["thread_id"]
        body = {
            "assistant_id": "chat",
            "input": {"messages": [{"role": "user", "content": "go"}]},
            "stream_mode": ["messages-tuple"],
        }
        async with session.post(f"{base}/threads/{thread}/runs/stream", json=body) as response:
            response.raise_for_status()
            async for event, data in sse_data(response):
                if event == "messages" and isinstance(data, list) and data:
                    text = data[0].get("content")
                    if isinstance(text, str) and text:
                        yield text

    return read


async def one(mode: Mode, deltas: int) -> dict[str, float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        cpu = mode.server.cpu()
        start = time.perf_counter()
        first = None
        chars = 0
        async for text in mode.read(session):
            if first is None:
                first = time.perf_counter() - start
            chars += len(text)
        elapsed = time.perf_counter() - start
    await asyncio.sleep(0.3)  # let the server finish its bookkeeping of the run (its CPU counts)
    spent = mode.server.cpu() - cpu
    if chars != deltas * PIECE:
        raise RuntimeError(f"{mode.name}: {chars} characters streamed, {deltas * PIECE} expected")
    return {"rate": deltas / elapsed, "first_ms": (first or 0) * 1000, "cpu_us": spent / deltas * 1e6}


def langgraph_command(option: str | None) -> tuple[str | None, str]:
    """The `langgraph` executable to use, or None and why not."""
    path = option or os.environ.get("LANGGRAPH_BIN") or shutil.which("langgraph")
    if not path:
        return None, "no `langgraph` executable (pass --langgraph or set LANGGRAPH_BIN)"
    python = Path(path).parent / "python"
    if not python.exists():
        return None, f"{path}: no python beside it (a venv's bin/langgraph is expected)"
    probe = subprocess.run(
        [str(python), "-c", "import langgraph_api, langgraph_runtime_inmem, langchain_openai"],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        return None, f"{path}: its environment lacks langgraph-cli[inmem] or langchain-openai"
    return path, ""


async def bench(deltas: int, rounds: int, langgraph: str | None) -> None:
    print(f"load before: {loadavg()}")
    lg_path, why_not = langgraph_command(langgraph)
    servers: list[Server] = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "upstream.json"
        script.write_text(json.dumps({"replies": [], "default": {"text": "x" * PIECE * deltas, "chunk_size": PIECE}}))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        try:
            port = free_port()
            upstream = Server(
                "upstream",
                [
                    sys.executable,
                    "-m",
                    "agent_gateway.testing.fake_openai",
                    "--port",
                    str(port),
                    "--script",
                    str(script),
                ],
                f"http://127.0.0.1:{port}",
                env,
                ROOT,
            )
            servers.append(upstream)
            await upstream.wait_ready("/v1/models")
            config = Path(tmp) / "gateway.toml"
            config.write_text(f'[chat_only]\nbase_url = "{upstream.url}/v1"\napi_key = "bench"\nmodel = "m"\n')
            port = free_port()
            gw_env = {k: v for k, v in env.items() if not k.startswith(("AGENT_GATEWAY", "OPENAI_"))}
            gateway = Server(
                "gateway",
                [
                    sys.executable,
                    "-m",
                    "agent_gateway.cli",
                    "serve",
                    "--config",
                    str(config),
                    "--port",
                    str(port),
                    "--data-dir",
                    str(Path(tmp) / "data"),
                    "--log-format",
                    "text",
                ],
                f"http://127.0.0.1:{port}",
                gw_env,
                ROOT,
            )
            servers.append(gateway)
            await gateway.wait_ready("/v1/health")
            modes = [
                Mode("bare", upstream, chat_reader(upstream.url, "m")),
                Mode("gateway-openai", gateway, chat_reader(gateway.url, "chat-only")),
                Mode("gateway-native", gateway, native_reader(gateway.url)),
            ]
            if lg_path:
                port = free_port()
                lg_env = {
                    **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                    "OPENAI_BASE_URL": upstream.url + "/v1",
                    "OPENAI_API_KEY": "bench",
                    "LANGSMITH_TRACING": "false",
                    "LANGCHAIN_TRACING_V2": "false",
                    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
                }
                lg = Server(
                    "langgraph",
                    [
                        lg_path,
                        "dev",
                        "--no-browser",
                        "--no-reload",
                        "--port",
                        str(port),
                        "--server-log-level",
                        "WARNING",
                    ],
                    f"http://127.0.0.1:{port}",
                    lg_env,
                    # A copy: `langgraph dev` keeps its state (.langgraph_api/) beside the graph.
                    Path(shutil.copytree(HERE / "_langgraph_app", Path(tmp) / "langgraph_app")),
                )
                servers.append(lg)
                await lg.wait_ready("/ok")
                modes.append(Mode("langgraph", lg, langgraph_reader(lg.url)))
            else:
                print(f"langgraph: skipped ({why_not})")
            for mode in modes:  # one warm-up each (imports, first connections, JIT-free caches)
                await one(mode, deltas)
            results: dict[str, list[dict[str, float]]] = {mode.name: [] for mode in modes}
            for round_no in range(rounds):
                order = modes[round_no % len(modes) :] + modes[: round_no % len(modes)]
                for mode in order:
                    results[mode.name].append(await one(mode, deltas))
                line = ", ".join(f"{m.name} {results[m.name][-1]['rate']:,.0f}/s" for m in modes)
                print(f"round {round_no + 1}: {line}")
        finally:
            for server in reversed(servers):
                server.stop()
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    bare = med["bare"]
    print(f"\n{deltas:,} pieces of {PIECE} characters, medians of {rounds} interleaved rounds:")
    print(f"the fixture's own rate (bare client on the fake upstream): {bare['rate']:,.0f} pieces/s")
    for name, m in med.items():
        print(
            f"{name:15} {m['rate']:9,.0f} pieces/s ({m['rate'] / bare['rate']:.2f}x bare), first text "
            f"{m['first_ms']:7.1f} ms, server CPU {m['cpu_us']:6.1f} us/piece"
        )
    if "langgraph" in med:
        gw, lg = med["gateway-native"], med["langgraph"]
        print(
            f"gateway (native stream) against LangGraph: {gw['rate'] / lg['rate']:.1f}x the pieces/s, "
            f"{gw['cpu_us'] / lg['cpu_us']:.2f}x the server CPU per piece, first text "
            f"{gw['first_ms']:.1f} ms vs {lg['first_ms']:.1f} ms"
        )
    print(f"load after: {loadavg()}")


@click.command()
@click.option("--deltas", default=5000, show_default=True, help="Pieces the upstream streams per turn.")
@click.option("--rounds", default=5, show_default=True)
@click.option("--langgraph", default=None, help="A `langgraph` executable (default: $LANGGRAPH_BIN, then PATH).")
def main(deltas: int, rounds: int, langgraph: str | None) -> None:
    asyncio.run(bench(deltas, rounds, langgraph))


if __name__ == "__main__":
    main()
