"""The host end of a sandbox's network: an allow-listing CONNECT proxy per sandbox on a Unix
socket, and one MCP-only HTTP server on a Unix socket for every sandbox.

Why a Unix socket and not a routed interface: the agent's network namespace then has no route out
at all. The only ways out are the sockets the gateway binds into it, and the gateway decides per
connection: a ``CONNECT host:port`` is answered ``200`` and relayed only when ``(host, port)`` is
on that sandbox's allow list (its model endpoints, ``[sandbox] network``), else ``403``. The MCP
socket serves ``/v1/mcp`` alone (lease tokens), never the gateway's HTTP API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger("agent_gateway.sandbox.egress")

HEAD_LIMIT = 8192
CONNECT_TIMEOUT = 10.0
CHUNK = 65536


class EgressProxy:
    """One sandbox's way out: a Unix socket that relays allowed CONNECTs."""

    def __init__(self, directory: Path, allowed: list[tuple[str, int]], counters: dict[str, int]) -> None:
        self.directory = directory
        self.path = directory / "egress.sock"
        self.allowed = {(host.lower(), port) for host, port in allowed}
        self._counters = counters
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> EgressProxy:
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        # The agent may run as another user; only this sandbox sees the socket (its folder is
        # bound into that one sandbox, and the folder above it is the gateway's alone).
        os.chmod(self.path, 0o666)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        shutil.rmtree(self.directory, ignore_errors=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            # close() cancels open relays; asyncio's stream callback would log a cancelled handler
            # task as an error ("Exception in callback ..."), so it ends quietly instead.
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CONNECT_TIMEOUT)
        if len(head) > HEAD_LIMIT:
            return await self._refuse(writer, 431, "request head too large")
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != "CONNECT":
            return await self._refuse(writer, 405, "only CONNECT is relayed")
        host, sep, port_text = parts[1].rpartition(":")
        host = host.strip("[]").lower()
        if not sep or not port_text.isdigit() or (host, int(port_text)) not in self.allowed:
            self._counters["denied"] = self._counters.get("denied", 0) + 1
            log.info("sandbox egress refused: %s is not on the agent's allow list", parts[1][:200])
            return await self._refuse(writer, 403, "not on this agent's network allow list")
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port_text)), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            return await self._refuse(writer, 502, "could not connect")
        self._counters["allowed"] = self._counters.get("allowed", 0) + 1
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        try:
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            up_writer.close()

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, status: int, why: str) -> None:
        body = why.encode()
        writer.write(
            f"HTTP/1.1 {status} Refused\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
        )
        with contextlib.suppress(OSError):
            await writer.drain()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, ConnectionError):
        pass
    finally:
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()


class SandboxNetwork:
    """The gateway's side of every sandbox's network: per-sandbox egress proxies and the one
    MCP-only server, under a private runtime folder (short paths: Unix socket paths are limited
    to about 100 bytes, which a data directory may exceed)."""

    def __init__(self, mcp_app: web.Application | None = None) -> None:
        self._mcp_app = mcp_app
        self._root: Path | None = None
        self._mcp_runner: web.AppRunner | None = None
        self._mcp_path: Path | None = None
        self._mcp_lock = asyncio.Lock()
        self.counters: dict[str, int] = {}

    def _runtime_root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="agw-sbx-"))
            os.chmod(self._root, 0o711)
        return self._root

    async def open_egress(self, allowed: list[tuple[str, int]]) -> EgressProxy:
        directory = self._runtime_root() / secrets.token_hex(6)
        directory.mkdir(mode=0o755)
        return await EgressProxy(directory, allowed, self.counters).start()

    async def mcp_socket(self) -> Path | None:
        """The MCP-only server's socket folder (started on first use)."""
        if self._mcp_app is None:
            return None
        async with self._mcp_lock:
            if self._mcp_path is None:
                directory = self._runtime_root() / "mcp"
                directory.mkdir(mode=0o755, exist_ok=True)
                path = directory / "mcp.sock"
                runner = web.AppRunner(self._mcp_app, handle_signals=False, access_log=None)
                await runner.setup()
                site = web.UnixSite(runner, str(path))
                await site.start()
                os.chmod(path, 0o666)
                self._mcp_runner, self._mcp_path = runner, path
        return self._mcp_path

    async def close(self) -> None:
        if self._mcp_runner is not None:
            with contextlib.suppress(Exception):
                await self._mcp_runner.cleanup()
            self._mcp_runner = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def status(self) -> dict[str, Any]:
        return dict(self.counters)
