"""What confining an agent costs: its cold start and a warm turn, sandboxed against not, same run.

    python bench/bench_sandbox.py [--rounds 20] [--chunks 2000]

The agent is ``bench/_fast_acp_agent.py`` (a raw stdio JSON-RPC writer; ``--standalone`` prints its
own write rate, far above what either path reads). Each round starts it twice, alternating which
comes first: bare (``AcpProcess`` on the command) and confined (the command the built-in
bubblewrap sandbox gives, with its network supervisor, egress socket and MCP-only socket). It
measures:

- **cold start**: from process start to the ``initialize`` answer;
- **warm turn**: a ``session/prompt`` of ``--chunks`` message chunks on the live session.

It prints medians, the added milliseconds of a cold start and the ratio of warm turns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_gateway.acp.client import AcpProcess  # noqa: E402
from agent_gateway.plugin_host import PluginHost  # noqa: E402
from agent_gateway.sandbox import AgentLaunch, Sandbox, program_paths  # noqa: E402
from agent_gateway.sandbox.egress import SandboxNetwork  # noqa: E402

AGENT = [sys.executable, str(ROOT / "bench" / "_fast_acp_agent.py"), "--mode", "line"]


async def one(argv: list[str], env: dict[str, str], cwd: str, chunks: int) -> tuple[float, float]:
    received = 0
    done = asyncio.Event()

    def on_update(_session: str, _update: object) -> None:
        nonlocal received
        received += 1

    started = time.perf_counter()
    async with AcpProcess(argv, env=env, cwd=cwd, on_update=on_update, name="bench") as agent:
        await agent.initialize(timeout=30)
        cold = time.perf_counter() - started
        session = await agent.new_session(cwd, [], timeout=30)
        await agent.prompt(session, [{"type": "text", "text": str(chunks)}], timeout=60)  # warm-up turn
        received = 0
        began = time.perf_counter()
        await agent.prompt(session, [{"type": "text", "text": str(chunks)}], timeout=60)
        warm = time.perf_counter() - began
    done.set()
    return cold, warm


async def main(rounds: int, chunks: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    network = SandboxNetwork()
    sandbox = Sandbox({"mode": "required"}, PluginHost.load(), data_dir=data, egress=network.open_egress)
    home = sandbox.home_for("bench", "alice")
    sandbox.prepare_home(home)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)}
    bare: list[tuple[float, float]] = []
    confined: list[tuple[float, float]] = []
    try:
        for index in range(rounds):
            launch = AgentLaunch(
                "bench", "alice", "w", list(AGENT), dict(env), home, home, home / "no-workspace",
                read_only=program_paths(AGENT, env["PATH"], [str(data)]), network=[("127.0.0.1", 9)],
            )  # fmt: skip
            command = await sandbox.confine(launch)
            order = [("bare", AGENT, env), ("confined", command.argv, command.env)]
            for name, argv, environment in order if index % 2 == 0 else reversed(order):
                result = await one(argv, environment, str(home), chunks)
                (bare if name == "bare" else confined).append(result)
            if command.cleanup is not None:
                await command.cleanup()
    finally:
        await network.close()
    cold_bare = statistics.median(c for c, _ in bare) * 1000
    cold_confined = statistics.median(c for c, _ in confined) * 1000
    warm_bare = statistics.median(w for _, w in bare) * 1000
    warm_confined = statistics.median(w for _, w in confined) * 1000
    print(f"rounds {rounds}, {chunks} chunks a warm turn (medians)")
    print(f"cold start: bare {cold_bare:.1f} ms, confined {cold_confined:.1f} ms: +{cold_confined - cold_bare:.1f} ms")
    print(
        f"warm turn:  bare {warm_bare:.1f} ms, confined {warm_confined:.1f} ms: ratio {warm_confined / warm_bare:.3f}"
    )


if __name__ == "__main__":
    rate = subprocess.run([*AGENT[:2], "--standalone", "200000", "--mode", "line"], capture_output=True, text=True)
    print(f"the agent alone: {rate.stdout.strip()}")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.chunks))
