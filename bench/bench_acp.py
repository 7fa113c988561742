"""ACP benchmarks: the gateway's cost over a bare ACP client, and second-turn latency by session mode.

    python bench/bench_acp.py flood [--chunks 10000] [--repeat 5]
    python bench/bench_acp.py fast [--chunks 20000] [--repeat 5] [--write block|line|encode[@RATE] ...]
    python bench/bench_acp.py turns [--agent reasonix --agent hermes] [--repeat 3]
    python bench/bench_acp.py all

`flood`: one turn of N message chunks from the fake ACP agent (`python contrib/fake_acp_agents/agent.py
--behaviour flood`, prompt "flood N"), read (a) by a bare `agent_gateway.acp.AcpProcess` and (b) through a
gateway process (journalled, streamed to one SSE client in this process). Both on a warm agent
process (the first turn, which starts it, is not timed); the figure is the median turn time.

`fast`: one turn of N chunks from bench/_fast_acp_agent.py, a raw stdio ACP agent (no SDK) that
writes as fast as it can (`--write`: pre-encoded blocks, one pre-encoded line a write, or each line
encoded on its own; `@RATE`: at most RATE messages a second, e.g. `line@120000`, an agent at about
the gateway's own pace; `/BACKLOG`: through a runtime whose `coalesce_backlog` is BACKLOG, e.g.
`line@120000/32` beside `line@120000` to compare with the former threshold in the same invocation).
Default: `block`, `line` and `line@120000`, each agent's own rate (its
`--standalone` figure) printed beside its ratio. Every agent is measured in each round, rounds
interleaved; three figures per agent and round, on warm agent processes: prompt sent
-> prompt response read by a bare asyncio reader of the agent's stdout that (a) only counts lines
or (b) parses every line with `json.loads` (the least any JSON-RPC client does), and (c) `POST
/v1/runs` -> the run's terminal event on its SSE stream (a raw-socket client counting frames),
through a gateway process running the agent as an ACP runtime (which journals a backlog's text
chunks joined: the events per turn and the events/s it sustained are printed too). Medians; the
ratio is (c) / (b).

`turns`: the latency of a turn with the real Reasonix / Hermes (installed by contrib/peers/install.sh)
on a fake LLM, by how the gateway found the agent session: `native_live` (the next turn on a live
binding), `loaded` (the first turn after a gateway restart on the same data dir: process start,
`session/load`, prompt) and `fresh` (the first turn of a new gateway data dir and agent home:
process start, `session/new`, prompt). Medians, and ratios against `native_live`.

Every ratio compares figures measured in the same run on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from agent_gateway.acp.client import AcpProcess  # noqa: E402
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply  # noqa: E402

FAKE_AGENT = [sys.executable, str(ROOT / "contrib" / "fake_acp_agents" / "agent.py"), "--behaviour", "flood"]
# A raw stdio writer (bench/_fast_acp_agent.py; `--standalone N` prints its rate), by how it writes.
FAST_MODES = ("block", "line", "encode")
FAST_DEFAULT = ["block", "line", "line@120000"]
BINARIES = {"reasonix": ("REASONIX_BIN", "reasonix"), "hermes": ("HERMES_ACP_BIN", "hermes-acp")}


def fake_agent_env(state_dir: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_ACP_STATE_DIR": state_dir}


# -- 1. flood: gateway vs bare ACP client --------------------------------------------------------


async def bare_client(chunks: int, repeat: int) -> list[float]:
    received: list[int] = [0]

    def on_update(session_id: str, update: dict[str, Any]) -> None:
        if update.get("sessionUpdate") == "agent_message_chunk":
            received[0] += len(update.get("content", {}).get("text", ""))

    times = []
    with tempfile.TemporaryDirectory() as state:
        async with AcpProcess(FAKE_AGENT, env=fake_agent_env(state), cwd=str(ROOT), on_update=on_update) as agent:
            await agent.initialize(timeout=60)
            session_id = await agent.new_session(state, [], timeout=60)
            await agent.prompt(session_id, [{"type": "text", "text": "flood 10"}], timeout=60)  # warm-up
            for _ in range(repeat):
                received[0] = 0
                start = time.perf_counter()
                result = await agent.prompt(session_id, [{"type": "text", "text": f"flood {chunks}"}], timeout=600)
                times.append(time.perf_counter() - start)
                assert result.get("stopReason") == "end_turn", result
                assert received[0] == chunks, (received[0], chunks)
    return times


def serve_flood(data_dir: str, state_dir: str, agents: str = "flood") -> None:
    """A gateway process with the fake flood agent as ACP runtime `flood`, or the comma-separated
    `fast-<mode>[@<rate>]` agents (bench/_fast_acp_agent.py) each as a runtime of that id (the
    `serve-flood` mode), the garbage collector tuned as `agent-gateway serve` does."""
    from aiohttp import web

    from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime, AcpSessionStrategy
    from agent_gateway.app import create_app
    from agent_gateway.cli import tune_gc_for_serving
    from agent_gateway.config import Config
    from agent_gateway.hookspecs import hookimpl
    from agent_gateway.plugin_host import PluginHost

    class FloodPlugin:
        @hookimpl
        def register_runtimes(self, register: Any, config: Any) -> None:
            for agent in names:
                command = FAKE_AGENT if agent == "flood" else fast_command(agent)
                env = fake_agent_env(state_dir)
                spec = AcpAgentSpec(agent, agent, "fake", command, env=env, process_dir=ROOT)
                if "/" in agent:  # the runtime's coalesce_backlog, to compare with another in one invocation
                    spec.coalesce_backlog = int(agent.rsplit("/", 1)[1])
                register(AcpRuntime(spec))

        @hookimpl
        def session_strategy(self, runtime: Any, config: Any) -> Any:
            return AcpSessionStrategy() if runtime.agent_id in names else None

    names = agents.split(",")

    async def main() -> None:
        overrides = {"gateway": {"data_dir": data_dir}, "reasonix": {"enabled": False}, "hermes": {"enabled": False}}
        config = Config.load(None, env={}, overrides=overrides)
        app = create_app(config, PluginHost.load(env={}, extra=(FloodPlugin(),)))
        runner = web.AppRunner(app, access_log=None)
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

    asyncio.run(main())


async def gateway_turn(http: aiohttp.ClientSession, url: str, agent: str, session_id: str, message: str) -> dict:
    """POST a run and read its SSE stream to the end: elapsed time, text received, the receipt."""
    body = {"requestId": uuid.uuid4().hex, "agentId": agent, "sessionId": session_id, "message": message}
    start = time.perf_counter()
    async with http.post(f"{url}/v1/runs", json=body) as response:
        assert response.status == 201, await response.text()
        run_id = (await response.json())["hostRunId"]
    text: list[str] = []
    events = 0
    last_kind = ""
    async with http.get(f"{url}/v1/runs/{run_id}/stream") as response:
        kind = ""
        async for raw in response.content:
            line = raw.rstrip(b"\r\n")
            if line.startswith(b"event: "):
                kind = line[7:].decode()
            elif line.startswith(b"data: "):
                events += 1
                last_kind = kind
                if kind == "message.delta":
                    text.append(json.loads(line[6:])["payload"]["text"])
    elapsed = time.perf_counter() - start
    async with http.get(f"{url}/v1/runs/{run_id}") as response:
        receipt = await response.json()
    return {"elapsed": elapsed, "text": "".join(text), "events": events, "last": last_kind, "receipt": receipt}


async def through_gateway(url: str, chunks: int, repeat: int) -> tuple[list[float], list[int]]:
    times, events = [], []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await gateway_turn(http, url, "flood", "bench", "flood 10")  # starts the agent process
        for _ in range(repeat):
            turn = await gateway_turn(http, url, "flood", "bench", f"flood {chunks}")
            assert turn["last"] == "run.completed", turn["receipt"]
            assert turn["receipt"]["sessionMode"] == "native_live", turn["receipt"]
            assert len(turn["text"]) == chunks, (len(turn["text"]), chunks)
            times.append(turn["elapsed"])
            events.append(turn["events"])
    return times, events


def bench_flood(chunks: int, repeat: int) -> None:
    bare = asyncio.run(bare_client(chunks, repeat))
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as state_dir:
        server = subprocess.Popen(
            [sys.executable, __file__, "serve-flood", data_dir, state_dir],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            gateway, events = asyncio.run(through_gateway(url, chunks, repeat))
        finally:
            server.terminate()
            server.wait(timeout=30)
    bare_median, gateway_median = statistics.median(bare), statistics.median(gateway)
    print(f"== flood: one turn of {chunks} chunks, fake ACP agent, median of {repeat} (warm process)")
    print(f"bare AcpProcess client:           {bare_median:.3f} s  ({chunks / bare_median:,.0f} chunks/s)")
    print(
        f"gateway, journalled, 1 SSE client: {gateway_median:.3f} s  ({chunks / gateway_median:,.0f} chunks/s; "
        f"{min(events)}-{max(events)} SSE events per turn)"
    )
    print(f"ratio gateway/bare: {gateway_median / bare_median:.2f}")


# -- 1b. fast: a fast agent, gateway vs a bare reader ------------------------------------------------

TERMINAL_FRAMES = (b"event: run.completed", b"event: run.failed", b"event: run.cancelled", b"event: run.interrupted")
DATA_LINE = b"\ndata: "
RESPONSE_PREFIX = b'{"jsonrpc":"2.0","id":'  # how the fast agent starts a response line (notifications: "method")


class BareReader:
    """The baseline: a minimal asyncio ACP client of the fast agent, no gateway code. `parse` reads
    its stdout line by line (`StreamReader.readline`) and parses every line (`json.loads`), as any
    JSON-RPC client must to tell the updates from the response, counting the chunks' text until the
    prompt's response; `count` only counts lines until the response line (the pipe's own rate)."""

    def __init__(self, mode: str, agent: list[str]) -> None:
        self.mode = mode
        self.agent = agent
        self.next_id = 0

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.agent, stdin=subprocess.PIPE, stdout=subprocess.PIPE, limit=1 << 24
        )
        await self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        self.session_id = (await self.call("session/new", {"cwd": str(ROOT), "mcpServers": []}))["sessionId"]

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()
        return json.loads(await self.proc.stdout.readline())["result"]

    async def turn(self, chunks: int) -> float:
        """Prompt sent → prompt response read; checks every chunk arrived."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        prompt = {"sessionId": self.session_id, "prompt": [{"type": "text", "text": f"flood {chunks}"}]}
        request = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": "session/prompt", "params": prompt})
        readline = self.proc.stdout.readline
        received = 0
        start = time.perf_counter()
        self.proc.stdin.write(request.encode() + b"\n")
        if self.mode == "count":
            while not (await readline()).startswith(RESPONSE_PREFIX):
                received += 1
        else:
            loads = json.loads
            while True:
                message = loads(await readline())
                if "id" in message:
                    assert message["result"]["stopReason"] == "end_turn", message
                    break
                received += len(message["params"]["update"]["content"]["text"])
        elapsed = time.perf_counter() - start
        assert received == chunks, (received, chunks)
        return elapsed

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()


async def sse_turn(
    http: aiohttp.ClientSession, url: str, chunks: int, mode: str = "native_live", agent: str = "flood"
) -> dict[str, Any]:
    """POST a run, read its SSE stream on a raw socket to the terminal event (frames counted with
    `bytes.count`, so that this client is not the bottleneck); then check the text and the receipt."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = {
        "requestId": uuid.uuid4().hex,
        "agentId": agent,
        "sessionId": f"bench-{agent}",
        "message": f"flood {chunks}",
    }
    start = time.perf_counter()
    async with http.post(f"{url}/v1/runs", json=body) as response:
        assert response.status == 201, await response.text()
        run_id = (await response.json())["hostRunId"]
    writer.write(f"GET /v1/runs/{run_id}/stream HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    frames, carry = 0, b""
    keep = max(len(DATA_LINE), *(len(t) for t in TERMINAL_FRAMES)) + 64
    while True:
        block = await reader.read(1 << 18)
        if not block:
            raise RuntimeError("the stream ended before the run's terminal event")
        window = carry + block
        frames += window.count(DATA_LINE) - carry.count(DATA_LINE)
        terminal = max(window.rfind(t) for t in TERMINAL_FRAMES)
        if terminal >= 0 and b"\n\n" in window[terminal:]:
            break
        carry = window[-keep:]
    elapsed = time.perf_counter() - start
    writer.close()
    async with http.get(f"{url}/v1/runs/{run_id}") as response:
        receipt = await response.json()
    assert receipt["status"] == "completed" and receipt["sessionMode"] == mode, receipt
    # The run's last events (every frame is one event; the seqs are 1..frames).
    async with http.get(f"{url}/v1/runs/{run_id}/events?afterSeq={max(0, frames - 20)}&limit=50") as response:
        tail = (await response.json())["events"]
    completed = [e["payload"]["text"] for e in tail if e["kind"] == "message.completed"]
    assert completed == ["x" * chunks], [len(t) for t in completed]
    return {"elapsed": elapsed, "frames": frames}


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def fast_runs(
    url: str, server_pid: int, agents: list[str], chunks: int, repeat: int
) -> dict[str, dict[str, list[float]]]:
    """Interleaved rounds: in each, every agent's three figures one after the other. Besides wall
    times, the CPU seconds each side spent: the bare reader's (this process) and the gateway
    process's (every thread; not the SSE client's): less sensitive than wall time to other load on
    the machine."""
    keys = ("count", "parse", "gateway", "frames", "parse_cpu", "gateway_cpu")
    results = {name: {key: [] for key in keys} for name in agents}
    bares = {name: {mode: BareReader(mode, fast_command(name)) for mode in ("count", "parse")} for name in agents}
    for readers in bares.values():
        for bare in readers.values():
            await bare.start()
            await bare.turn(100)  # warm-up
    timeout = aiohttp.ClientTimeout(total=600)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            for name in agents:
                await sse_turn(http, url, 100, "new_session", name)  # starts the agent process: not timed
            for _ in range(repeat):  # interleaved, so that each figure sees the same load
                for name in agents:
                    figures = results[name]
                    for mode, bare in bares[name].items():
                        cpu = own_cpu()
                        figures[mode].append(await bare.turn(chunks))
                        if mode == "parse":
                            figures["parse_cpu"].append(own_cpu() - cpu)
                    cpu = process_cpu(server_pid)
                    turn = await sse_turn(http, url, chunks, agent=name)
                    figures["gateway"].append(turn["elapsed"])
                    figures["gateway_cpu"].append(process_cpu(server_pid) - cpu)  # (read at once: the run has ended)
                    figures["frames"].append(turn["frames"])
    finally:
        for readers in bares.values():
            for bare in readers.values():
                await bare.close()
    return results


def fast_command(name: str) -> list[str]:
    """`fast-<mode>[@<rate>][/<backlog>]` → the command of bench/_fast_acp_agent.py writing that way."""
    mode, _, rate = name.removeprefix("fast-").partition("/")[0].partition("@")
    return [sys.executable, str(HERE / "_fast_acp_agent.py"), "--mode", mode, *(["--rate", rate] if rate else [])]


def fast_write(value: str) -> str:
    write, _, backlog = value.partition("/")
    mode, _, rate = write.partition("@")
    if (
        mode not in FAST_MODES
        or (rate and (mode == "block" or not rate.isdigit()))
        or (backlog and not backlog.isdigit())
    ):
        raise argparse.ArgumentTypeError(f"{value!r}: block, line[@RATE] or encode[@RATE], then [/BACKLOG]")
    return value


def bench_fast(chunks: int, repeat: int, writes: list[str]) -> dict[str, Any]:
    """Every agent of `writes` (`<mode>[@<rate>]`) against its own bare readers, through one gateway
    process that runs each as its own ACP runtime, rounds interleaved across the agents."""
    agents = [f"fast-{write}" for write in writes]
    own_rates = {
        name: subprocess.run(
            [*fast_command(name), "--standalone", str(max(chunks, 200_000))], capture_output=True, text=True, check=True
        ).stdout.strip()
        for name in agents
    }
    load_before = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory() as data_dir, tempfile.TemporaryDirectory() as state_dir:
        server = subprocess.Popen(
            [sys.executable, __file__, "serve-flood", data_dir, state_dir, ",".join(agents)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            results = asyncio.run(fast_runs(url, server.pid, agents, chunks, repeat))
        finally:
            server.terminate()
            server.wait(timeout=30)
    load_after = Path("/proc/loadavg").read_text().split()[0]
    print(
        f"== fast: one turn of {chunks:,} chunks from bench/_fast_acp_agent.py, {len(agents)} agents, "
        f"median of {repeat} interleaved rounds (load {load_before} -> {load_after})"
    )
    summary: dict[str, Any] = {}
    for name in agents:
        figures = results[name]
        medians = {key: statistics.median(values) for key, values in figures.items()}
        pairs = [g / b for g, b in zip(figures["gateway"], figures["parse"], strict=True)]
        ratio = medians["gateway"] / medians["parse"]
        summary[name] = {"results": figures, "medians": medians, "pairs": pairs, "ratio": ratio}
        print(f"-- {name}: {own_rates[name]}")
        for key, label in (
            ("count", "bare reader, lines counted"),
            ("parse", "bare reader, json.loads per line"),
            ("gateway", "gateway, journalled, 1 SSE client"),
        ):
            runs = ", ".join(f"{t:.3f}" for t in figures[key])
            print(f"   {label:36s} {medians[key]:.3f} s  {chunks / medians[key]:>10,.0f} chunks/s   ({runs})")
        events_per_second = [f / t for f, t in zip(figures["frames"], figures["gateway"], strict=True)]
        print(
            f"   events (SSE frames) per gateway turn: {min(figures['frames']):,.0f}-{max(figures['frames']):,.0f}, "
            f"{statistics.median(events_per_second):,.0f} events/s sustained (median)"
            f"   (per round: {', '.join(f'{f:,.0f}' for f in figures['frames'])})"
        )
        print(
            f"   CPU per chunk: bare reader (json.loads) {1e6 * medians['parse_cpu'] / chunks:.2f} µs, "
            f"gateway process {1e6 * medians['gateway_cpu'] / chunks:.2f} µs (all threads; clock ticks of 10 ms)"
        )
        print(
            f"   ratio gateway / bare (json.loads): {ratio:.2f}"
            f"   (per round: {', '.join(f'{r:.2f}' for r in pairs)});"
            f" lines counted: {medians['gateway'] / medians['count']:.2f}"
        )
    print("summary: agent (its own rate): gateway / bare json.loads reader")
    for name in agents:
        rate = own_rates[name].rsplit("=", 1)[-1].strip()
        print(f"   {name:22s} ({rate}): {summary[name]['ratio']:.2f}")
    return summary


# -- 2. second-turn latency by session mode, real agents -------------------------------------------


def agent_binary(agent: str) -> str:
    variable, name = BINARIES[agent]
    peers = os.environ.get("AGENT_GATEWAY_PEERS_DIR") or str(Path.home() / ".cache" / "agent-gateway" / "peers")
    path = os.environ.get(variable) or os.path.join(peers, "bin", name)
    if not os.access(path, os.X_OK):
        sys.exit(f"{agent}: no executable at {path}; run contrib/peers/install.sh first")
    return path


def agent_overrides(agent: str, base_url: str, home: Path, data_dir: Path) -> dict[str, dict[str, Any]]:
    section: dict[str, Any] = {"env": {"HOME": str(home)}, "provider_base_url": base_url, "provider_model": "m"}
    if agent == "reasonix":
        section["command"] = [agent_binary(agent), "acp"]
    else:
        section["command"] = [agent_binary(agent)]
        section["hermes_home"] = str(home / "hermes")
    other = "hermes" if agent == "reasonix" else "reasonix"
    return {"gateway": {"data_dir": str(data_dir)}, agent: section, other: {"enabled": False}}


class Gateway:
    """A gateway app on a real socket in this process."""

    def __init__(self, overrides: dict[str, dict[str, Any]]) -> None:
        from agent_gateway.app import create_app
        from agent_gateway.config import Config
        from agent_gateway.plugin_host import PluginHost

        self.app = create_app(Config.load(None, env={}, overrides=overrides), PluginHost.load(env={}))

    async def __aenter__(self) -> str:
        from aiohttp import web

        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()  # closes the runtimes: the agent processes end


async def timed_turn(http: aiohttp.ClientSession, url: str, agent: str, session: str, message: str, mode: str) -> float:
    turn = await gateway_turn(http, url, agent, session, message)
    receipt = turn["receipt"]
    assert turn["last"] == "run.completed", receipt
    assert receipt["sessionMode"] == mode, (receipt["sessionMode"], mode, receipt.get("error"))
    return float(turn["elapsed"])


async def bench_agent(agent: str, repeat: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"native_live": [], "loaded": [], "fresh": []}
    fake = FakeOpenAI(default=lambda body: Reply(text="Short answer." if body.get("stream") else "A title"))
    await fake.start()
    timeout = aiohttp.ClientTimeout(total=300)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as http:
            with tempfile.TemporaryDirectory() as tmp:
                base = Path(tmp)
                # fresh: a new data dir and agent home each time (process start, session/new, prompt).
                for i in range(repeat):
                    home, data = base / f"fresh-home-{i}", base / f"fresh-data-{i}"
                    home.mkdir()
                    async with Gateway(agent_overrides(agent, fake.base_url, home, data)) as url:
                        results["fresh"].append(await timed_turn(http, url, agent, "s", "hello", "new_session"))
                # native_live: later turns on the live binding; loaded: the first turn after a restart.
                home, data = base / "home", base / "data"
                home.mkdir()
                config = agent_overrides(agent, fake.base_url, home, data)
                async with Gateway(config) as url:
                    await timed_turn(http, url, agent, "s", "hello", "new_session")
                    for _ in range(repeat):
                        results["native_live"].append(await timed_turn(http, url, agent, "s", "可以", "native_live"))
                for _ in range(repeat):
                    async with Gateway(config) as url:
                        results["loaded"].append(await timed_turn(http, url, agent, "s", "可以", "loaded"))
    finally:
        await fake.stop()
    return results


def bench_turns(agents: list[str], repeat: int) -> None:
    for agent in agents:
        results = asyncio.run(bench_agent(agent, repeat))
        live = statistics.median(results["native_live"])
        print(f"== {agent}: turn latency by session mode, fake LLM, median of {repeat}")
        for mode in ("native_live", "loaded", "fresh"):
            median = statistics.median(results[mode])
            runs = ", ".join(f"{t:.2f}" for t in results[mode])
            print(f"{mode:12s} {median:7.3f} s  x{median / live:6.1f}   ({runs})")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve-flood":
        serve_flood(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=("flood", "fast", "turns", "all"))
    parser.add_argument("--chunks", type=int, default=0, help="default: 10,000 for flood, 20,000 for fast")
    parser.add_argument("--repeat", type=int, default=0, help="default: 5 for flood, 3 for turns")
    parser.add_argument("--agent", action="append", choices=sorted(BINARIES), help="default: both")
    parser.add_argument(
        "--write",
        action="append",
        type=fast_write,
        help=f"fast: how an agent writes, {'|'.join(FAST_MODES)}[@RATE] (default: {' '.join(FAST_DEFAULT)})",
    )
    args = parser.parse_args()
    if args.which in ("flood", "all"):
        bench_flood(args.chunks or 10_000, args.repeat or 5)
    if args.which in ("fast", "all"):
        bench_fast(args.chunks or 20_000, args.repeat or 5, args.write or FAST_DEFAULT)
    if args.which in ("turns", "all"):
        bench_turns(args.agent or sorted(BINARIES), args.repeat or 3)


if __name__ == "__main__":
    main()
