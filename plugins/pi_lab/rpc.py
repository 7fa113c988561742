"""A client for `pi --mode rpc`: JSON records on stdin/stdout, one per LF-terminated line.

Framing follows Pi's RPC doc: stdout is read as bytes and split on ``\\n`` only (JSON strings may
hold U+2028/U+2029, which a text line reader would treat as line ends), an optional ``\\r`` is
stripped. Responses carry the command's ``id``; events carry none and go to the one listener the
runtime installs for the turn in flight (events outside a turn are kept in a short backlog).
Stderr is always drained (a full pipe stalls the agent) and its tail kept for error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 60
READ_LIMIT = 64 * 1024 * 1024  # one record may hold a whole message list (agent_end)


class PiError(Exception):
    """A command Pi answered with ``success: false`` (``str(exc)`` is Pi's own words)."""


class PiExited(Exception):
    """The Pi process ended; ``stderr_tail`` holds its last diagnostics."""

    def __init__(self, returncode: int | None, stderr_tail: str) -> None:
        detail = f"; stderr: {stderr_tail.strip()[-1500:]}" if stderr_tail.strip() else ""
        super().__init__(f"the pi process exited with code {returncode}{detail}")
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class PiProcess:
    """One running `pi --mode rpc` process."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._stderr: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._tasks: list[asyncio.Task[None]] = []
        self.listener: Callable[[dict[str, Any]], None] | None = None
        self.backlog: deque[dict[str, Any]] = deque(maxlen=200)
        self.exited = asyncio.Event()
        self._write_lock = asyncio.Lock()

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            cwd=str(self.cwd),
            limit=READ_LIMIT,
            start_new_session=True,  # its MCP children go with its process group
        )
        self._tasks = [
            asyncio.create_task(self._read_stdout(), name=f"pi-stdout-{self.proc.pid}"),
            asyncio.create_task(self._read_stderr(), name=f"pi-stderr-{self.proc.pid}"),
        ]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and not self.exited.is_set()

    @property
    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)

    def exit_error(self) -> PiExited:
        return PiExited(self.proc.returncode if self.proc else None, self.stderr_tail)

    # -- reading --------------------------------------------------------------------------------
    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stream = self.proc.stdout
        try:
            while True:
                try:
                    raw = await stream.readuntil(b"\n")  # LF only: U+2028 inside strings is data
                except asyncio.IncompleteReadError as end:
                    raw = end.partial
                    if raw.strip():
                        self._dispatch(raw)
                    break
                self._dispatch(raw)
        except Exception:
            log.exception("reading pi stdout failed")
        finally:
            with contextlib.suppress(Exception):
                await self.proc.wait()
            self.exited.set()
            error = self.exit_error()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self._pending.clear()
            if self.listener is not None:
                self.listener({"type": "_exited", "returncode": self.proc.returncode})

    def _dispatch(self, raw: bytes) -> None:
        line = raw.rstrip(b"\n").rstrip(b"\r")
        if not line.strip():
            return
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("pi wrote a non-JSON line on stdout: %r", line[:200])
            return
        if not isinstance(record, dict):
            return
        if record.get("type") == "response":
            future = self._pending.pop(str(record.get("id")), None) if "id" in record else None
            if future is not None:
                if not future.done():
                    future.set_result(record)
                return
            # A response without our id (a parse error): hand it on as an event.
        if self.listener is not None:
            self.listener(record)
        else:
            self.backlog.append(record)

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                self._stderr.append(text)
                log.debug("pi[%s] %s", self.pid, text)

    # -- commands -------------------------------------------------------------------------------
    async def send(self, command: dict[str, Any]) -> None:
        """Write one command without waiting for its response."""
        if not self.alive:
            raise self.exit_error()
        assert self.proc is not None and self.proc.stdin is not None
        data = json.dumps(command, ensure_ascii=False).encode("utf-8") + b"\n"
        async with self._write_lock:
            try:
                self.proc.stdin.write(data)
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise self.exit_error() from exc

    async def request(self, command: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        """Send a command and return its response's ``data``; raise PiError on ``success: false``."""
        command_id = f"gw-{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        try:
            await self.send({**command, "id": command_id})
            async with asyncio.timeout(timeout):
                response = await future
        finally:
            self._pending.pop(command_id, None)
        if not response.get("success"):
            raise PiError(str(response.get("error") or f"pi refused {command.get('type')}"))
        data = response.get("data")
        return data if isinstance(data, dict) else {}

    # -- shutdown -------------------------------------------------------------------------------
    async def close(self, grace: float = 5.0) -> None:
        """Close stdin (Pi's orderly shutdown), then SIGTERM, then SIGKILL its process group."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(Exception):
                if proc.stdin is not None:
                    proc.stdin.close()
            for sig, wait in ((None, grace), (signal.SIGTERM, grace), (signal.SIGKILL, grace)):
                if sig is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, sig)
                try:
                    async with asyncio.timeout(wait):
                        await proc.wait()
                    break
                except TimeoutError:
                    continue
        # MCP servers it started may linger in its group after Pi exits.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        for task in self._tasks:
            try:
                async with asyncio.timeout(grace):
                    await task
            except (TimeoutError, asyncio.CancelledError, Exception):
                task.cancel()
