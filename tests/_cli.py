"""Helpers for tests that drive the installed `agent-gateway` console script in a subprocess:
`serve` (waits for its listening line, SIGTERM on exit), `run_cli`, a clean environment, config files."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

WAIT = 30.0


LISTENING = re.compile(r"^agent-gateway listening on (https?://(\S+):(\d+))$")


def agent_gateway() -> str:
    """The installed console script (next to the interpreter, or on PATH)."""
    beside = Path(sys.executable).with_name("agent-gateway")
    found = str(beside) if beside.exists() else shutil.which("agent-gateway")
    assert found, "the agent-gateway console script is not installed (pip install -e .)"
    return found


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test process's environment without gateway or OpenAI settings, data under tmp_path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENT_GATEWAY", "OPENAI_")) and k != "PYTHONUNBUFFERED"
    }
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    env.update(extra)
    return env


async def run_cli(*args: str, env: dict[str, str], cwd: Path, timeout: float = WAIT) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        agent_gateway(),
        *args,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


class Served:
    """A running gateway subprocess (``agent-gateway serve`` or ``python -m agent_gateway.cli serve``),
    started by :func:`launch`: its URL from the listening line, stdout lines as read, stderr in a file."""

    def __init__(self, proc: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.proc = proc
        self.stderr_path = stderr_path
        self.lines: list[str] = []
        self.url = ""
        self.host = ""
        self.port = 0
        self._drain: asyncio.Task[None] | None = None

    async def readline(self, timeout: float = WAIT) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise AssertionError(f"serve exited early; stdout: {self.lines}; stderr: {self.stderr()}")
        line = raw.decode().rstrip("\n")
        self.lines.append(line)
        return line

    async def read_until(self, needle: str, timeout: float = WAIT) -> list[str]:
        """Lines up to and including the first one containing `needle` (bounded in time)."""
        start = len(self.lines)
        async with asyncio.timeout(timeout):
            while needle not in await self.readline(timeout):
                pass
        return self.lines[start:]

    def drain_stdout(self) -> None:
        """Read and drop stdout from now on (so a chatty gateway never blocks on a full pipe)."""

        async def drain(stream: asyncio.StreamReader) -> None:
            while await stream.readline():
                pass

        assert self.proc.stdout is not None and self._drain is None
        self._drain = asyncio.create_task(drain(self.proc.stdout))

    def stderr(self, tail: int | None = None) -> str:
        text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return text if tail is None else text[-tail:]

    def log(self, tail: int = 6000) -> str:
        """The end of the gateway's stderr (its log)."""
        return self.stderr(tail)

    def kill(self) -> None:
        """SIGKILL the gateway now (synchronously, so nothing runs between a decision and the kill)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)

    async def wait(self, timeout: float = WAIT) -> int:
        async with asyncio.timeout(timeout):
            code = await self.proc.wait()
        self._stop_drain()
        return code

    async def terminate(self, timeout: float = WAIT) -> int:
        """SIGTERM and wait for the exit (SIGKILL and fail if it does not come in time)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"serve did not stop on SIGTERM; stderr: {self.stderr()}") from None
        finally:
            self._stop_drain()

    async def stop(self) -> None:
        """Stop the gateway whatever it is doing: SIGTERM, then SIGKILL if it does not exit in time."""
        with contextlib.suppress(AssertionError):
            await self.terminate()

    def _stop_drain(self) -> None:
        if self._drain is not None:
            self._drain.cancel()


_serve_ids = itertools.count()


async def launch(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path, stderr_path: Path | None = None, timeout: float = WAIT
) -> Served:
    """Start a gateway process and wait (bounded) for its listening line; the one place the suite
    starts a gateway subprocess. A process that exits or stays silent fails with its stderr."""
    stderr_path = stderr_path or cwd / f"serve-{next(_serve_ids)}.err"
    with stderr_path.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    served = Served(proc, stderr_path)
    try:
        for line in await served.read_until("agent-gateway listening on", timeout):
            match = LISTENING.match(line)
            if match:
                served.url, served.host, served.port = match[1], match[2], int(match[3])
        assert served.url, f"no listening line in {served.lines}; stderr: {served.stderr()}"
    except BaseException:
        served.kill()
        await proc.wait()
        raise
    return served


@contextlib.asynccontextmanager
async def serve(*args: str, env: dict[str, str], cwd: Path) -> AsyncIterator[Served]:
    """Start `agent-gateway serve ARGS`, wait for its listening line; SIGTERM it on exit."""
    served = await launch([agent_gateway(), "serve", *args], env=env, cwd=cwd)
    try:
        yield served
    finally:
        if served.proc.returncode is None:
            await served.stop()


def write_config(tmp_path: Path, gateway: dict[str, Any], extra: str = "") -> Path:
    lines = ["[gateway]"] + [f"{key} = {json.dumps(value)}" for key, value in gateway.items()]
    path = tmp_path / "gateway.toml"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


BUILT_INS = {
    "core",
    "journal_peewee",
    "chat_only",
    "reasonix",
    "hermes",
    "workspace",
    "pi_lab",
    "lightrag",
    "ag_ui",
    "openai_compat",
    "cluster_redis",
    "sandbox_bubblewrap",
    "auth_jwt",
    "otel",
}
