"""A gateway process with a `burst` runtime that emits N events as fast as it can (bench only).

    python bench/_burst_server.py DATA_DIR [STORAGE_URL]

Prints its URL, then serves until SIGTERM. Run options (in the run's `options`):
`events` (count), `rate` (events/s, 0 = as fast as possible), `chars` (text per delta),
`distinct` (each delta's text is its index, `"%06d "`, so a reassembled text can be checked),
`stamp` (put `time.monotonic()` in each payload as `t`: CLOCK_MONOTONIC is system-wide on Linux, so
a client process on this host measures emit-to-receive latency), `subscribers` (wait until that many
SSE clients are attached to the run before emitting; emission then starts with a `plan.updated`
event whose payload holds `t0`, the monotonic start time).
"""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from typing import Any

from aiohttp import web

import agent_gateway.journal
from agent_gateway.app import GATEWAY_KEY, create_app
from agent_gateway.cli import tune_gc_for_serving
from agent_gateway.config import Config
from agent_gateway.hookspecs import hookimpl
from agent_gateway.plugin_host import PluginHost
from agent_gateway.runtime import RuntimePolicy, Turn, TurnOutcome


class BurstRuntime:
    bus: Any = None  # the gateway's event bus, set once the app is made (to wait for subscribers)

    agent_id = "burst"
    display_name = "Burst (benchmark)"
    provider = "bench"
    policy = RuntimePolicy(context_carrier="none")

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        options = turn.options
        count = int(options.get("events", 10000))
        rate = float(options.get("rate", 0))  # events/s; 0 = as fast as possible
        distinct = bool(options.get("distinct"))
        stamp = bool(options.get("stamp"))
        subscribers = int(options.get("subscribers", 0))
        if subscribers:
            bus = self.bus
            topic = turn.run.host_run_id
            while bus.subscriber_count(topic) < subscribers:  # noqa: ASYNC110 (the bus has no hook)
                await asyncio.sleep(0.005)  # polling a bench-only precondition
            await turn.emit("plan.updated", {"t0": time.monotonic()})
        loop = asyncio.get_running_loop()
        start = loop.time()
        text = "x" * int(options.get("chars", 16))
        emit = turn.emit
        for i in range(count):
            if distinct:
                await emit("message.delta", {"text": f"{i:06d} "})
            elif stamp:
                await emit("message.delta", {"text": text, "t": time.monotonic()})
            else:
                await emit("message.delta", {"text": text})
            if rate:
                delay = start + (i + 1) / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing the emitter, not synchronisation
            elif i % 100 == 99:
                await asyncio.sleep(0)  # let writers run, as a real agent's reads would
        return TurnOutcome("completed")

    async def close(self) -> None:
        pass


class BurstPlugin:
    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(BurstRuntime())


async def main(data_dir: str, storage_url: str) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 SSE clients need the fds
    # The fan-out scenario holds 200 runs of one actor open at once (each waits for its clients):
    # the default of 64 active runs per actor would refuse the 65th with a 429.
    overrides: dict[str, dict[str, Any]] = {"gateway": {"data_dir": data_dir, "max_active_runs_per_actor": 1000}}
    if storage_url:
        overrides["storage"] = {"url": storage_url}
    # Profiling aids, never used for the documented figures: BENCH_EXPERIMENT="null-storage,gc-off,
    # no-session-nowait (a run's start reads its session on a worker), batch=N (journal_batch_events),
    # burst-publish=N (journal.BURST_PUBLISH),switch=S (GIL interval)".
    experiment = dict(item.partition("=")[::2] for item in os.environ.get("BENCH_EXPERIMENT", "").split(",") if item)
    if "batch" in experiment:
        overrides["gateway"]["journal_batch_events"] = int(experiment["batch"])
    config = Config.load(None, env={}, overrides=overrides)
    app = create_app(config, PluginHost.load(env={}, extra=(BurstPlugin(),)))
    BurstRuntime.bus = app[GATEWAY_KEY].bus
    if "null-storage" in experiment:
        app[GATEWAY_KEY].storage.append_events = lambda events: None
    if "burst-publish" in experiment:
        agent_gateway.journal.BURST_PUBLISH = int(experiment["burst-publish"])
    if "no-session-nowait" in experiment:  # a run's start reads its session record on a worker
        storage: Any = app[GATEWAY_KEY].storage
        storage.get_session_nowait = None
    if "gc-off" in experiment:
        import gc

        gc.disable()
    if "switch" in experiment:
        sys.setswitchinterval(float(experiment["switch"]))
    runner = web.AppRunner(app, handle_signals=True, access_log=None)
    await runner.setup()
    tune_gc_for_serving()  # as `agent-gateway serve` does
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"http://127.0.0.1:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""))
