"""A gateway process with a `burst` runtime that emits N events as fast as it can (bench only)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from aiohttp import web

from gateway.app import create_app
from gateway.config import Config
from gateway.plugins import PluginHost
from gateway.runtime import RuntimePolicy, Turn, TurnOutcome
from hookspecs import hookimpl


class BurstRuntime:
    agent_id = "burst"
    display_name = "Burst (benchmark)"
    provider = "bench"
    policy = RuntimePolicy(context_carrier="none")

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        count = int(turn.options.get("events", 10000))
        rate = float(turn.options.get("rate", 0))  # events/s; 0 = as fast as possible
        loop = asyncio.get_running_loop()
        start = loop.time()
        text = "x" * int(turn.options.get("chars", 16))
        for i in range(count):
            await turn.emit("message.delta", {"text": text})
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
    overrides: dict[str, dict[str, Any]] = {"gateway": {"data_dir": data_dir}}
    if storage_url:
        overrides["storage"] = {"url": storage_url}
    config = Config.load(None, env={}, overrides=overrides)
    app = create_app(config, PluginHost.load(env={}, extra=(BurstPlugin(),)))
    runner = web.AppRunner(app, handle_signals=True, access_log=None)
    await runner.setup()
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
