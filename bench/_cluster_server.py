"""One cluster instance with the `burst` runtime (bench only).

    python bench/_cluster_server.py DATA_DIR STORAGE_URL REDIS_URL INSTANCE_ID KEY_PREFIX [LEASE HEARTBEAT]

REDIS_URL "-": no cluster (one instance on STORAGE_URL, the baseline). Prints its URL, then serves
until SIGTERM. The runtime is `_burst_server.py`'s (see its options).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from _burst_server import BurstPlugin
from aiohttp import web

from agent_gateway.app import create_app
from agent_gateway.cli import tune_gc_for_serving
from agent_gateway.config import Config, section_specs_from_hook
from agent_gateway.plugin_host import PluginHost


async def main(argv: list[str]) -> None:
    data_dir, storage_url, redis_url, instance_id, prefix = argv[:5]
    lease, heartbeat = (float(argv[5]), float(argv[6])) if len(argv) > 6 else (10.0, 2.0)
    overrides: dict[str, dict[str, Any]] = {"gateway": {"data_dir": data_dir}, "storage": {"url": storage_url}}
    if redis_url != "-":
        overrides["cluster"] = {
            "redis_url": redis_url,
            "instance_id": instance_id,
            "key_prefix": prefix,
            "lease_seconds": lease,
            "heartbeat_seconds": heartbeat,
            # Every instance of one bench signs with the same secret (its key prefix, repeated).
            "secret": (prefix * 32)[:64],
        }
    plugins = PluginHost.load(env={}, extra=(BurstPlugin(),))
    config = Config.load(None, section_specs_from_hook(plugins.config_sections()), env={}, overrides=overrides)
    runner = web.AppRunner(create_app(config, plugins), handle_signals=True, access_log=None)
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


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
