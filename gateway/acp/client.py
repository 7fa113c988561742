"""ACP client transport: one agent subprocess spoken to over JSON-RPC 2.0 on stdio.

This module knows no runtime by name; runtime plugins build on it. It does not
use the official Python SDK on purpose: the SDK drops unknown update kinds,
rejects non-standard ``stopReason`` values, deadlocks when the agent's stderr is
never read and reorders updates when the handler awaits. Here:

* every message is one line of JSON on the agent's stdout (split on ``\\n``
  only); lines of any size up to ``max_message_bytes`` pass (stdout is read in
  blocks of up to ``read_limit`` bytes, at most 1 MiB, and a line that spans
  blocks is reassembled);
* a single reader task handles stdout in arrival order. ``session/update``
  notifications are handed to ``on_update`` inline (a sync callback, or one
  returning an awaitable, which is awaited before the next line is handled: no
  task or coroutine per update otherwise) — or, with ``on_updates``, as one list
  of the consecutive updates that arrived in one read of stdout — and a
  response resolves its request only after every update received before it has
  been delivered — so the last chunk of a turn is always seen before
  ``prompt()`` returns;
* agent→client requests (``session/request_permission``, ``fs/*``, anything
  registered in ``request_handlers``) are started in arrival order but run as
  their own tasks, so a permission waiting for a human never stalls the
  stream; unknown methods get ``-32601``, a failing handler ``-32603`` with its
  message, an :class:`AcpRequestError` its own code;
* stderr is always drained by its own task into a bounded ring buffer
  (:meth:`AcpProcess.stderr_tail`), so a chatty agent can never block;
* results are raw dicts: ``stopReason`` is a plain string, never validated.

Cancelling a local ``prompt()`` call does not stop the agent: call
:meth:`AcpProcess.cancel`, which sends ``session/cancel`` and answers that
session's open permission requests with the ``cancelled`` outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

from agent_gateway.environment import agent_environment
from agent_gateway.server.fairness import yield_slice

__all__ = [
    "CANCELLED_PERMISSION",
    "PROTOCOL_VERSION",
    "AcpError",
    "AcpProcess",
    "AcpProcessExited",
    "AcpRemoteError",
    "AcpRequestError",
    "AcpTimeout",
    "NotificationHandler",
    "RequestHandler",
    "UpdateHandler",
    "UpdatesHandler",
]

log = logging.getLogger("agent_gateway.acp")

PROTOCOL_VERSION = 1
DEFAULT_CLIENT_INFO: dict[str, Any] = {
    "name": "agent-gateway",
    "title": "Agent Gateway",
    "version": "0.1",
}
#: The answer to a permission request that was cancelled (ACP ``RequestPermissionOutcome``).
CANCELLED_PERMISSION: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}

#: ``on_update(session_id, update)``; may return an awaitable, which is awaited in order.
UpdateHandler = Callable[[str, dict[str, Any]], Awaitable[None] | None]
#: ``on_updates([(session_id, update), ...])``: consecutive updates read together, in order; may
#: return an awaitable, which is awaited before the next message is handled.
UpdatesHandler = Callable[[list[tuple[str, Any]]], Awaitable[None] | None]
#: An agent→client request handler: ``handler(params)`` → the JSON result (or an awaitable of it).
RequestHandler = Callable[[dict[str, Any]], Awaitable[Any] | Any]
#: ``on_notification(method, params)`` for notifications other than ``session/update``.
NotificationHandler = Callable[[str, Any], Awaitable[None] | None]

#: Bytes asked of stdout per read (at most `read_limit`): a turn's updates arrive in a few large
#: reads, and the loop turns after each full one (a block's lines are parsed and handled in one
#: go: about 1,000-2,500 updates, 2-5 ms of the loop, so other runs and requests get in).
READ_BLOCK = 256 * 1024
PIPE_BYTES = 1024 * 1024
_SKIP = object()  # a stdout line that carries no message

_METHOD_PERMISSION = "session/request_permission"
_METHOD_READ = "fs/read_text_file"
_METHOD_WRITE = "fs/write_text_file"


class AcpError(Exception):
    """Base class of every error raised by this module."""


class AcpTimeout(AcpError, TimeoutError):
    """A request got no answer within its timeout."""

    def __init__(self, method: str, seconds: float) -> None:
        super().__init__(f"ACP request {method!r} timed out after {seconds:g}s")
        self.method = method
        self.seconds = seconds


class AcpRemoteError(AcpError):
    """The agent answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None, *, method: str | None = None) -> None:
        where = f" to {method!r}" if method else ""
        super().__init__(f"agent error{where} [{code}]: {message}")
        self.code = code
        self.message = message
        self.data = data
        self.method = method


class AcpProcessExited(AcpError):
    """The agent process exited (or closed its stdout) with requests outstanding."""

    def __init__(self, returncode: int | None, stderr_tail: str) -> None:
        if returncode is None:
            what = "ACP agent connection closed"
        else:
            what = f"ACP agent exited with code {returncode}"
        tail = stderr_tail.strip()
        detail = f"; stderr tail: {tail[-2000:]}" if tail else ""
        super().__init__(what + detail)
        self.returncode = returncode
        self.stderr_tail = stderr_tail


class AcpRequestError(AcpError):
    """Raise from an agent→client request handler to answer with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.data = data


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


class AcpProcess:
    """An ACP agent subprocess and the JSON-RPC client connection to it.

    ``env`` is the child's whole environment; ``None`` gives it the base agent environment
    (:func:`agent_gateway.environment.agent_environment`), never the gateway's whole one.
    With ``new_process_group`` (POSIX) the agent runs in its own process group and
    :meth:`close` signals the whole group, so the helper processes of wrapper launchers (npm
    shims, shells) do not outlive it.

    Use ``async with AcpProcess(cmd, ...) as agent:`` or :meth:`start` /
    :meth:`close`.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        on_update: UpdateHandler | None = None,
        on_updates: UpdatesHandler | None = None,
        on_permission: RequestHandler | None = None,
        on_read_text_file: RequestHandler | None = None,
        on_write_text_file: RequestHandler | None = None,
        request_handlers: Mapping[str, RequestHandler] | None = None,
        on_notification: NotificationHandler | None = None,
        stderr_limit: int = 64 * 1024,
        read_limit: int = 8 * 1024 * 1024,
        max_message_bytes: int = 256 * 1024 * 1024,
        exit_grace: float = 2.0,
        new_process_group: bool = True,
        name: str | None = None,
    ) -> None:
        if not command:
            raise ValueError("command must not be empty")
        self.command: list[str] = [str(part) for part in command]
        self.env: dict[str, str] = dict(env) if env is not None else agent_environment()
        self.cwd: str | None = os.fspath(cwd) if cwd is not None else None
        self.name: str = name or os.path.basename(self.command[0])
        self.on_update = on_update
        # Takes the place of `on_update` when given: one call per run of updates read together.
        self.on_updates = on_updates
        self.on_notification = on_notification
        self._has_fs_read = on_read_text_file is not None
        self._has_fs_write = on_write_text_file is not None
        handlers: dict[str, RequestHandler] = {_METHOD_PERMISSION: on_permission or self._deny_permission}
        if on_read_text_file is not None:
            handlers[_METHOD_READ] = on_read_text_file
        if on_write_text_file is not None:
            handlers[_METHOD_WRITE] = on_write_text_file
        handlers.update(request_handlers or {})
        self.request_handlers: dict[str, RequestHandler] = handlers
        self._stderr_limit = max(1, stderr_limit)
        self._read_limit = read_limit
        self._max_message_bytes = max_message_bytes
        self._exit_grace = exit_grace
        self._new_process_group = new_process_group and sys.platform != "win32"

        self._proc: asyncio.subprocess.Process | None = None
        self._stderr = bytearray()
        self._next_id = 0
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._open_permissions: dict[Any, tuple[str | None, asyncio.Task[Any]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._reader_task: asyncio.Task[None] | None = None
        self._stderr_task: asyncio.Task[None] | None = None
        self._finished = False
        self._closed_event = asyncio.Event()
        #: Lines on stdout that were not JSON-RPC (logged, then skipped).
        self.protocol_errors = 0
        #: The raw ``initialize`` result once :meth:`initialize` has run.
        self.init_result: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AcpProcess:
        """Spawn the agent and start the reader and stderr tasks."""
        if self._proc is not None:
            raise AcpError("AcpProcess already started")
        self._proc = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
            limit=self._read_limit,
            start_new_session=self._new_process_group,
        )
        log.debug("started ACP agent %s pid=%s: %s", self.name, self._proc.pid, self.command)
        self._widen_stdout_pipe()
        self._stderr_task = asyncio.create_task(self._drain_stderr(), name=f"acp-stderr-{self.name}")
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"acp-reader-{self.name}")
        watch = asyncio.create_task(self._watch_exit(), name=f"acp-watch-{self.name}")
        self._tasks = [self._stderr_task, self._reader_task, watch]
        return self

    def _widen_stdout_pipe(self) -> None:
        """Let the agent write up to `PIPE_BYTES` ahead of the reader (Linux; the default pipe holds
        64 KiB): fewer, larger reads for a fast agent. Best effort: the pipe works either way."""
        set_size = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
        if set_size is None:
            return
        with contextlib.suppress(Exception):  # an older kernel, a lower pipe-max-size, a private API moved
            transport = self._proc._transport.get_pipe_transport(1)  # type: ignore[union-attr,attr-defined]
            fcntl.fcntl(transport.get_extra_info("pipe").fileno(), set_size, PIPE_BYTES)

    async def __aenter__(self) -> AcpProcess:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process has exited (negative: killed by that signal)."""
        return self._proc.returncode if self._proc is not None else None

    @property
    def closed(self) -> bool:
        """True once the connection is unusable (process exited, stdout closed, or closed)."""
        return self._finished

    @property
    def agent_capabilities(self) -> dict[str, Any]:
        caps = self.init_result.get("agentCapabilities")
        return caps if isinstance(caps, dict) else {}

    def stderr_tail(self, max_bytes: int | None = None) -> str:
        """The last bytes (at most ``stderr_limit``) the agent wrote to stderr, decoded."""
        data = bytes(self._stderr if max_bytes is None else self._stderr[-max_bytes:])
        return data.decode("utf-8", errors="replace")

    async def wait_closed(self, timeout: float | None = None) -> int | None:
        """Wait until the connection is closed; return the exit code (``None`` if still running)."""
        async with asyncio.timeout(timeout):
            await self._closed_event.wait()
        return self.returncode

    async def close(self, grace: float = 2.0) -> int | None:
        """Stop the agent: close stdin, wait ``grace``, then SIGTERM, then SIGKILL.

        Bounded: returns within about ``3 * grace`` plus the task clean-up.
        Pending requests fail with :class:`AcpProcessExited`.
        """
        proc = self._proc
        if proc is None:
            self._finish()
            return None
        if proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            if not await self._wait_exit(grace):
                self._signal(signal.SIGTERM)
                if not await self._wait_exit(grace):
                    self._signal(signal.SIGKILL)
                    await self._wait_exit(grace)
        if self._new_process_group and proc.returncode is not None:
            # Orphans of the agent (its own children) share its process group.
            self._signal(signal.SIGKILL)
        running = [task for task in self._tasks if not task.done()]
        if running:
            await asyncio.wait(running, timeout=grace)
        for task in [*self._tasks, *self._handler_tasks]:
            if not task.done():
                task.cancel()
        self._finish()
        return proc.returncode

    async def _wait_exit(self, seconds: float) -> bool:
        assert self._proc is not None
        try:
            async with asyncio.timeout(seconds):
                await asyncio.shield(self._proc.wait())
        except TimeoutError:
            return False
        return True

    def _signal(self, sig: int) -> None:
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if self._new_process_group:
                os.killpg(proc.pid, sig)
            elif proc.returncode is None:
                proc.send_signal(sig)

    async def _watch_exit(self) -> None:
        assert self._proc is not None
        await self._process_gone(self._proc)
        if self._new_process_group:
            # The agent's own children (a launcher's real binary) may still hold our pipes open.
            self._signal(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._exit_grace):
                await self._proc.wait()  # the exit code, once the pipes have closed
        # Let the reader dispatch what the agent wrote before dying, and the
        # stderr task collect its last words, before failing pending requests.
        waiting = [task for task in (self._reader_task, self._stderr_task) if task is not None and not task.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=self._exit_grace)
        self._finish()

    @staticmethod
    async def _process_gone(proc: asyncio.subprocess.Process) -> None:
        """Wait until the process itself exits. `Process.wait()` also waits for every pipe to
        close, which never happens while a child of the agent keeps them open; a pidfd tells
        the exit alone."""
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            await proc.wait()
            return
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()
        loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
        waiter = asyncio.ensure_future(proc.wait())
        try:
            await asyncio.wait({exited, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            waiter.cancel()

    def _exited_error(self) -> AcpProcessExited:
        return AcpProcessExited(self.returncode, self.stderr_tail())

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        for method, future in self._pending.values():
            if not future.done():
                future.set_exception(self._exited_error())
                log.debug("ACP %s: request %s failed: agent gone", self.name, method)
        self._pending.clear()
        for task in list(self._handler_tasks):
            task.cancel()
        self._closed_event.set()

    # ------------------------------------------------------------------ stderr

    async def _drain_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        stream = self._proc.stderr
        while True:
            chunk = await stream.read(64 * 1024)
            if not chunk:
                return
            self._stderr += chunk
            excess = len(self._stderr) - self._stderr_limit
            if excess > 0:
                del self._stderr[:excess]

    # ------------------------------------------------------------------ stdout

    async def _read_loop(self) -> None:
        """Read stdout in large blocks and split them into lines in C (`bytes.split`): no Python
        per line until its JSON is parsed. Lines are handled in order; a handler that awaits (an
        update waiting for room in the journal) stops the reading until it returns, so a slow
        consumer holds the agent back through the pipe."""
        assert self._proc is not None and self._proc.stdout is not None
        read = self._proc.stdout.read
        block_size = max(64 * 1024, min(self._read_limit, READ_BLOCK))
        max_bytes = self._max_message_bytes
        partial: list[bytes] = []  # the start of a line that spans blocks
        partial_size = 0
        oversized = False
        try:
            while True:
                block = await read(block_size)
                if not block:  # EOF: a last line without its newline still counts
                    if partial and not oversized:
                        await self._handle_lines([b"".join(partial)])
                    elif oversized:
                        self._drop_oversized(partial_size)
                    break
                lines = block.split(b"\n")
                rest = lines.pop()  # after the last newline: b"" when the block ends a line
                if partial or oversized:
                    if not lines:  # still no newline: the line goes on
                        partial_size += len(rest)
                        if partial_size > max_bytes:
                            oversized = True
                            partial.clear()
                        elif not oversized:
                            partial.append(rest)
                        continue
                    partial_size += len(lines[0])
                    if oversized or partial_size > max_bytes:
                        self._drop_oversized(partial_size)
                        del lines[0]
                    else:
                        partial.append(lines[0])
                        lines[0] = b"".join(partial)
                    partial, partial_size, oversized = [], 0, False
                if lines:
                    await self._handle_lines(lines)
                if len(block) >= block_size:
                    # More is likely buffered, and a buffered read does not suspend: let the loop
                    # turn before the next block (an agent far ahead would hold it otherwise), and
                    # requests that just arrived go first.
                    await yield_slice()
                if rest:
                    partial_size = len(rest)
                    if partial_size > max_bytes:
                        oversized = True
                    else:
                        partial.append(rest)
        except Exception:
            log.exception("ACP %s: reader failed", self.name)
        finally:
            if not self._finished:
                self._tasks.append(
                    asyncio.get_running_loop().create_task(self._after_stdout_eof(), name=f"acp-eof-{self.name}")
                )

    def _drop_oversized(self, size: int) -> None:
        self.protocol_errors += 1
        log.error("ACP %s: dropped a %d-byte line (max_message_bytes)", self.name, size)

    async def _after_stdout_eof(self) -> None:
        # stdout closed: the process normally exits right after; if it does
        # not, the connection is dead anyway.
        if not await self._wait_exit(self._exit_grace):
            log.warning("ACP %s closed stdout but is still running", self.name)
        if self._stderr_task is not None and not self._stderr_task.done():
            await asyncio.wait([self._stderr_task], timeout=self._exit_grace)
        self._finish()

    async def _handle_lines(self, lines: list[bytes]) -> None:
        """Handle complete lines in order. A ``session/update`` notification (most lines of a
        turn) is parsed with orjson and handed on right here, with no coroutine or task per line:
        to ``on_update`` one by one (its result awaited only when it is awaitable), or, with
        ``on_updates``, as the list of consecutive updates of these lines, delivered before the
        next other message is handled and at their end."""
        on_updates = self.on_updates
        batch: list[tuple[str, Any]] = []
        for line in lines:
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                message = self._parse_slowly(line)
                if message is _SKIP:
                    continue
            if type(message) is dict and message.get("method") == "session/update" and message.get("id") is None:
                params = message.get("params")
                if type(params) is not dict:
                    params = {}
                session_id = params.get("sessionId")
                session_id = session_id if type(session_id) is str else "" if session_id is None else str(session_id)
                if on_updates is not None:
                    batch.append((session_id, params.get("update")))
                    continue
                on_update = self.on_update
                if on_update is None:
                    continue
                try:
                    result = on_update(session_id, params.get("update"))
                    if result is not None and inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("ACP %s: handler for session/update failed", self.name)
                continue
            if batch:  # the updates before this message are delivered before it is handled
                await self._deliver_updates(batch)
                batch = []
            if type(message) is list:
                for item in message:
                    await self._dispatch(item)
            else:
                await self._dispatch(message)
        if batch:
            await self._deliver_updates(batch)

    async def _deliver_updates(self, updates: list[tuple[str, Any]]) -> None:
        assert self.on_updates is not None
        try:
            result = self.on_updates(updates)
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("ACP %s: handler for session/update failed", self.name)

    def _parse_slowly(self, line: bytes) -> Any:
        """What orjson refuses: a blank line (skipped), JSON only the standard library reads (an
        integer beyond 64 bits, an escaped lone surrogate), or not JSON (counted, skipped)."""
        text = line.strip()
        if not text:
            return _SKIP
        try:
            return json.loads(text)
        except ValueError:
            self.protocol_errors += 1
            log.warning("ACP %s: non-JSON line on stdout: %.200r", self.name, text)
            return _SKIP

    async def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            self.protocol_errors += 1
            log.warning("ACP %s: not a JSON-RPC object: %.200r", self.name, message)
            return
        method = message.get("method")
        if isinstance(method, str):
            if message.get("id") is not None:
                self._start_request(message["id"], method, message.get("params"))
            else:
                await self._handle_notification(method, message.get("params"))
        elif "id" in message:
            self._handle_response(message)
        else:
            self.protocol_errors += 1
            log.warning("ACP %s: unrecognised message: %.200r", self.name, message)

    def _handle_response(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        if isinstance(request_id, str) and request_id.isdigit():
            request_id = int(request_id)
        entry = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
        if entry is None:
            log.debug("ACP %s: response to unknown or abandoned request %r", self.name, request_id)
            return
        method, future = entry
        if future.done():
            return
        error = message.get("error")
        if error is not None:
            if isinstance(error, dict):
                code = error.get("code")
                future.set_exception(
                    AcpRemoteError(
                        code if isinstance(code, int) else -32603,
                        str(error.get("message", "")),
                        error.get("data"),
                        method=method,
                    )
                )
            else:
                future.set_exception(AcpRemoteError(-32603, str(error), method=method))
        else:
            future.set_result(message.get("result"))

    async def _handle_notification(self, method: str, params: Any) -> None:
        try:
            if method == "session/update":
                params = params if isinstance(params, dict) else {}
                session_id = params.get("sessionId")
                session_id = "" if session_id is None else str(session_id)
                if self.on_updates is not None:
                    await _maybe_await(self.on_updates([(session_id, params.get("update"))]))
                elif self.on_update is not None:
                    await _maybe_await(self.on_update(session_id, params.get("update")))
            elif self.on_notification is not None:
                await _maybe_await(self.on_notification(method, params))
            else:
                log.debug("ACP %s: ignored notification %s", self.name, method)
        except Exception:
            log.exception("ACP %s: handler for %s failed", self.name, method)

    # ------------------------------------------------------------------ agent → client requests

    def _start_request(self, request_id: Any, method: str, params: Any) -> None:
        # The handler starts now, in arrival order, and is registered before
        # anything else can run (so cancel() always finds an open permission).
        loop = asyncio.get_running_loop()
        params = params if isinstance(params, dict) else {}
        handler = self.request_handlers.get(method)
        inner: asyncio.Task[Any] | None = None
        if handler is not None:
            inner = loop.create_task(_call(handler, params), name=f"acp-handler-{method}")
            self._track(inner)
            if method == _METHOD_PERMISSION:
                self._open_permissions[request_id] = (params.get("sessionId"), inner)
        self._track(loop.create_task(self._answer(request_id, method, inner), name=f"acp-answer-{method}"))

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._handler_tasks.add(task)
        task.add_done_callback(self._handler_tasks.discard)

    async def _answer(self, request_id: Any, method: str, inner: asyncio.Task[Any] | None) -> None:
        response: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        if inner is None:
            response["error"] = {"code": -32601, "message": f"Method not found: {method}"}
        else:
            try:
                await asyncio.wait([inner])
            finally:
                self._open_permissions.pop(request_id, None)
                if not inner.done():
                    inner.cancel()
            if inner.cancelled():
                if method == _METHOD_PERMISSION:
                    response["result"] = CANCELLED_PERMISSION
                else:
                    response["error"] = {"code": -32603, "message": f"{method} was cancelled"}
            elif (exc := inner.exception()) is not None:
                if isinstance(exc, AcpRequestError):
                    response["error"] = {"code": exc.code, "message": exc.message}
                    if exc.data is not None:
                        response["error"]["data"] = exc.data
                else:
                    log.warning("ACP %s: handler for %s raised %r", self.name, method, exc)
                    response["error"] = {"code": -32603, "message": str(exc) or type(exc).__name__}
            else:
                result = inner.result()
                response["result"] = {} if result is None else result
        try:
            await self._send(response)
        except AcpError:
            log.debug("ACP %s: could not answer %s: agent gone", self.name, method)

    @staticmethod
    async def _deny_permission(params: dict[str, Any]) -> dict[str, Any]:
        return CANCELLED_PERMISSION

    # ------------------------------------------------------------------ client → agent

    async def _send(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None:
            raise AcpError("AcpProcess not started")
        if self._finished or proc.stdin is None or proc.stdin.is_closing():
            raise self._exited_error()
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise self._exited_error() from exc

    async def request(self, method: str, params: Any = None, timeout: float | None = None) -> Any:
        """Send a request and return its raw ``result``.

        Raises :class:`AcpTimeout` after ``timeout`` seconds (``None``: wait
        forever), :class:`AcpRemoteError` for a JSON-RPC error answer and
        :class:`AcpProcessExited` if the agent goes away first.
        """
        if self._finished:
            raise self._exited_error()
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (method, future)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                await self._send(message)
                return await future
        except TimeoutError:
            if deadline.expired():
                raise AcpTimeout(method, timeout if timeout is not None else 0.0) from None
            raise
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no answer expected)."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._send(message)

    # ------------------------------------------------------------------ typed helpers

    async def initialize(
        self,
        client_capabilities: Mapping[str, Any] | None = None,
        timeout: float | None = 30.0,
        *,
        client_info: Mapping[str, Any] | None = None,
        protocol_version: int = PROTOCOL_VERSION,
    ) -> dict[str, Any]:
        """``initialize``; returns the raw result (also kept in :attr:`init_result`).

        Without ``client_capabilities`` the ``fs`` capabilities advertise the
        handlers given to the constructor, and ``terminal`` is false.
        """
        if client_capabilities is None:
            client_capabilities = {
                "fs": {"readTextFile": self._has_fs_read, "writeTextFile": self._has_fs_write},
                "terminal": False,
            }
        result = await self.request(
            "initialize",
            {
                "protocolVersion": protocol_version,
                "clientCapabilities": dict(client_capabilities),
                "clientInfo": dict(client_info or DEFAULT_CLIENT_INFO),
            },
            timeout,
        )
        self.init_result = result if isinstance(result, dict) else {}
        return self.init_result

    async def new_session_raw(
        self, cwd: str, mcp_servers: Sequence[Mapping[str, Any]] | None = None, timeout: float | None = 60.0
    ) -> dict[str, Any]:
        """``session/new``; the raw result (``sessionId``, ``modes``, ``configOptions``, ...)."""
        result = await self.request(
            "session/new", {"cwd": cwd, "mcpServers": [dict(s) for s in mcp_servers or []]}, timeout
        )
        if not isinstance(result, dict) or not isinstance(result.get("sessionId"), str):
            raise AcpError(f"agent answered session/new without a sessionId: {result!r:.200}")
        return result

    async def new_session(
        self, cwd: str, mcp_servers: Sequence[Mapping[str, Any]] | None = None, timeout: float | None = 60.0
    ) -> str:
        """``session/new``; returns the new ``sessionId``."""
        return str((await self.new_session_raw(cwd, mcp_servers, timeout))["sessionId"])

    async def load_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
        timeout: float | None = 120.0,
    ) -> dict[str, Any]:
        """``session/load``. Replayed updates reach ``on_update`` before this returns."""
        params = {"sessionId": session_id, "cwd": cwd, "mcpServers": [dict(s) for s in mcp_servers or []]}
        return _as_dict(await self.request("session/load", params, timeout))

    async def resume_session(
        self,
        session_id: str,
        cwd: str,
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
        timeout: float | None = 60.0,
    ) -> dict[str, Any]:
        """``session/resume`` (no replay)."""
        params = {"sessionId": session_id, "cwd": cwd, "mcpServers": [dict(s) for s in mcp_servers or []]}
        return _as_dict(await self.request("session/resume", params, timeout))

    async def close_session(self, session_id: str, timeout: float | None = 30.0) -> dict[str, Any]:
        """``session/close``."""
        return _as_dict(await self.request("session/close", {"sessionId": session_id}, timeout))

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, timeout: float | None = 30.0
    ) -> dict[str, Any]:
        """``session/list``; the raw result (``sessions``, ``nextCursor``)."""
        params: dict[str, Any] = {}
        if cwd is not None:
            params["cwd"] = cwd
        if cursor is not None:
            params["cursor"] = cursor
        return _as_dict(await self.request("session/list", params, timeout))

    async def set_config_option(
        self, session_id: str, config_id: str, value: str | bool, timeout: float | None = 30.0
    ) -> dict[str, Any]:
        """``session/set_config_option`` (e.g. the model); booleans carry ``type: boolean``."""
        params: dict[str, Any] = {"sessionId": session_id, "configId": config_id, "value": value}
        if isinstance(value, bool):
            params["type"] = "boolean"
        return _as_dict(await self.request("session/set_config_option", params, timeout))

    async def set_mode(self, session_id: str, mode_id: str, timeout: float | None = 30.0) -> dict[str, Any]:
        """``session/set_mode``."""
        return _as_dict(await self.request("session/set_mode", {"sessionId": session_id, "modeId": mode_id}, timeout))

    async def prompt(
        self,
        session_id: str,
        blocks: str | Sequence[Mapping[str, Any]],
        timeout: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``session/prompt``; the raw result, ``stopReason`` left as the agent's string.

        ``blocks`` is a list of ACP content blocks, or a string for one text block; ``meta`` is
        sent as the request's ``_meta`` (e.g. a W3C ``traceparent``, a key ACP reserves for it).
        Every update of the turn has been delivered to ``on_update`` when this returns.
        """
        prompt = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else [dict(b) for b in blocks]
        params: dict[str, Any] = {"sessionId": session_id, "prompt": prompt}
        if meta:
            params["_meta"] = dict(meta)
        return _as_dict(await self.request("session/prompt", params, timeout))

    async def cancel(self, session_id: str) -> None:
        """Send ``session/cancel`` and answer the session's open permission requests ``cancelled``.

        A no-op once the agent is gone.
        """
        if self._finished:
            return
        with contextlib.suppress(AcpError):
            await self.notify("session/cancel", {"sessionId": session_id})
        for owner, task in list(self._open_permissions.values()):
            if owner == session_id:
                task.cancel()


async def _call(handler: RequestHandler, params: dict[str, Any]) -> Any:
    result: Any = handler(params)
    if inspect.isawaitable(result):
        result = await result
    return result


def _as_dict(result: Any) -> dict[str, Any]:
    return result if isinstance(result, dict) else {}
