"""The tool facade: the one way every tool call goes, whoever makes it.

    ``tools:call`` authorization (with an ``authorize`` plugin) → argument validation → path
    normalisation → allowed-roots check → version check → veto hooks → handler → diff summary
    → receipt in storage → ``tool_call_completed`` hooks

and, on the run's journal, one ``tool.started`` and one ``tool.completed`` event per call. A
refused or failed call still gets a receipt (``allowed: false`` with the reason) and a
``tool.completed`` event with ``status: "failed"``, then :class:`ToolError` is raised to the
caller. Receipts and events never carry file contents beyond a short diff head.

A call that wrote a file is also reported as ``files.changed`` (``cause: "tool"``, its
``receiptId``, the before/after versions) on the calling run's journal, right after its
``tool.completed`` and before the call returns — so before the run can end. Write observers (the
workspace watcher) hear of every write before it starts and after it ends, so they can tell its
inotify echo from a change no tool made.

Tools come from the ``register_tools`` hook as :class:`Tool` objects. Paths named by a tool's
``path_arguments`` (and by its ``scope_paths``, e.g. the run's current page) are resolved by
:mod:`agent_gateway.paths` before the handler runs; the handler finds them in ``call.paths`` and must
do its I/O with :func:`agent_gateway.paths.read_file_versioned` / :func:`write_file_atomically`.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent_gateway.json_schema import (
    SchemaValidator,
    cached_validator,
    compile_schema,
    error_message,
    first_error,
    type_name,
)
from agent_gateway.models import Run, now_ms
from agent_gateway.paths import FileVersion, PathError, ResolvedPath, current_version, resolve_path
from agent_gateway.workspace_access import WorkspaceAccess

if TYPE_CHECKING:
    from agent_gateway.journal import Journal
    from agent_gateway.storage import Storage

log = logging.getLogger("agent_gateway.tools")

RECEIPT_SCHEMA = "gateway.tool_receipt.v1"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
DIFF_HEAD_BYTES = 2048
DIFF_MAX_INPUT_BYTES = 2 * 1024 * 1024  # larger files get line counts only, no diff head
EVENT_STRING_CHARS = 120
NOTE_CHARS = 2000

# Codes a ToolError may carry (tools may add their own; keep them snake_case).
ERROR_CODES = (
    "unknown_tool",
    "capability_disabled",
    "invalid_arguments",
    "no_workspace",
    "path_refused",
    "outside_roots",
    "not_found",
    "not_a_file",
    "not_a_directory",
    "special_file",
    "path_changed",
    "stale_version",
    "already_exists",
    "vetoed",
    "forbidden",
    "not_text",
    "too_large",
    "patch_failed",
    "handler_failed",
)


class ToolError(Exception):
    """A refused or failed tool call: ``code`` (see ``ERROR_CODES``) and a clear message.
    ``receipt_id`` is set once the facade has stored the call's receipt."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.receipt_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "receiptId": self.receipt_id}


@dataclass
class Tool:
    """A tool as plugins register it.

    ``input_schema`` is the JSON Schema of the arguments (Draft 2020-12 unless it names another
    ``$schema``), checked when the tool is registered and enforced by :func:`validate_schema`.
    ``path_arguments`` name top-level string arguments that are paths: they are
    resolved and checked before the handler runs (``path_must_exist=False`` lets a tool name a
    file it will create). ``scope_paths`` returns further paths taken from the run (e.g. the
    current page); a None value refuses the call with ``not_found``. ``writes=True`` turns on
    the version check (``expectedHash`` / ``expectedMtime`` arguments) against the first path.
    A tool is hidden and refused when any of its ``capability_ids`` is disabled for the run."""

    name: str
    description: str
    input_schema: dict[str, Any]
    capability_ids: tuple[str, ...]
    handler: Callable[[ToolCall], Awaitable[dict[str, Any]]]
    path_arguments: tuple[str, ...] = ()
    writes: bool = False
    path_must_exist: bool = True
    scope_paths: Callable[[RunScope], Mapping[str, str | None]] | None = None
    # Core-internal tools (the ACP fs/* methods) go through the same pipeline but are not
    # offered to agents in `tools/list`.
    internal: bool = False

    def describe(self) -> dict[str, Any]:
        """The MCP ``tools/list`` entry."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": {"readOnlyHint": not self.writes, "destructiveHint": False},
        }


@dataclass
class RunScope:
    """Everything a call needs to know about its run. ``workspace_root`` is the configured
    directory of ``run.workspace_id`` (None: no file access at all); ``allowed_roots`` are the
    run's ``context.allowedRoots``, relative to it."""

    run: Run
    workspace_root: Path | None
    allowed_roots: list[str]
    agent_session_id: str | None = None
    model: str | None = None
    disabled_capabilities: frozenset[str] = frozenset()

    @classmethod
    def for_run(
        cls,
        run: Run,
        workspace_roots: Mapping[str, Path],
        *,
        agent_session_id: str | None = None,
        model: str | None = None,
        disabled_capabilities: frozenset[str] = frozenset(),
    ) -> RunScope:
        context = run.request.get("context") or {}
        roots = context.get("allowedRoots") or []
        if model is None:
            option = (run.request.get("options") or {}).get("model")
            model = option if isinstance(option, str) else None
        return cls(
            run,
            workspace_roots.get(run.workspace_id),
            [r for r in roots if isinstance(r, str)],
            agent_session_id or run.provider_run_id,
            model,
            disabled_capabilities,
        )

    @property
    def actor_id(self) -> str:
        return self.run.actor_id

    @property
    def workspace_id(self) -> str:
        return self.run.workspace_id

    @property
    def target(self) -> dict[str, Any]:
        target = (self.run.request.get("context") or {}).get("target")
        return target if isinstance(target, dict) else {}

    @property
    def page(self) -> str | None:
        """The current page's path, from the run's frozen context (``context.target.path``)."""
        path = self.target.get("path")
        return path if isinstance(path, str) and path else None

    @property
    def selection(self) -> dict[str, Any] | None:
        """The frozen selection ``{text, from, to}`` (``context.target.selection``), or None."""
        selection = self.target.get("selection")
        return selection if isinstance(selection, dict) else None


@dataclass
class WriteRecord:
    before: bytes | None
    after: bytes
    before_version: FileVersion | None
    after_version: FileVersion | None


@dataclass
class ToolCall:
    """One call in flight, as handlers and the veto / completed hooks see it."""

    id: str
    name: str
    tool: Tool | None
    arguments: dict[str, Any]
    scope: RunScope
    caller: str
    executor: Executor | None = None
    paths: dict[str, ResolvedPath] = field(default_factory=dict)
    # The first path's version when the version check ran (writes), or when a handler recorded a read.
    before_version: FileVersion | None = None
    after_version: FileVersion | None = None
    write: WriteRecord | None = None
    note: str | None = None
    # When the call began (ns since the epoch), for a tracer's span of it.
    started_ns: int = field(default_factory=time.time_ns)

    @property
    def path(self) -> ResolvedPath | None:
        """The call's primary path (its first path argument or scope path), if any."""
        return next(iter(self.paths.values()), None)

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run blocking work (file I/O) off the event loop, on the facade's executor."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def record_read(self, version: FileVersion) -> None:
        if self.before_version is None:
            self.before_version = version

    def record_write(
        self, before: bytes | None, after: bytes, before_version: FileVersion | None, after_version: FileVersion | None
    ) -> None:
        """Tell the facade what a write changed; it turns this into the receipt's diff summary
        and before/after versions (the bytes themselves are never stored)."""
        self.write = WriteRecord(before, after, before_version, after_version)
        self.before_version = before_version
        self.after_version = after_version


class WriteObserver(Protocol):
    """Told about every write a tool may make (``Tool.writes``): ``write_started`` before the
    handler runs, ``write_ended`` once the call is over — with the ``files.changed`` entry when it
    wrote (and its receipt is stored), None when it was refused or failed. Every start has one end."""

    def write_started(self, call: ToolCall) -> None: ...

    async def write_ended(self, call: ToolCall, change: dict[str, Any] | None) -> None: ...


# -- argument validation ---------------------------------------------------------------------------


def validate_schema(value: Any, schema: Mapping[str, Any], where: str = "arguments") -> None:
    """Validate ``value`` against the JSON Schema ``schema`` (Draft 2020-12 unless its ``$schema``
    names another dialect) with the complete `jsonschema` validator: every keyword is enforced
    (``$ref``/``$defs``, ``allOf``, ``not``, ``const``, ``if``/``then``/``else``,
    ``patternProperties``, ``uniqueItems``, ``dependentRequired``, ``format``, ...).

    Raises ToolError(invalid_arguments) naming the offending place below ``where``
    (``arguments.edits[0].search is required``, ``arguments.x must be string, got integer``).
    The schema is checked and its validator built on first use, then cached (keyed by the schema
    object): a schema that is not valid JSON Schema, or uses a keyword Draft 2020-12 does not
    define, raises ValueError. Tools' schemas are checked when the tool is registered."""
    _raise_invalid(cached_validator(schema, f"the schema for {where}"), value, where)


def _raise_invalid(validator: SchemaValidator, value: Any, where: str) -> None:
    error = first_error(validator, value)
    if error is not None:
        raise ToolError("invalid_arguments", error_message(error, where))


# -- summaries ----------------------------------------------------------------------------------------


def diff_summary(before: bytes | None, after: bytes, path: str) -> dict[str, Any]:
    """Lines added/removed and a unified diff head capped at ``DIFF_HEAD_BYTES``."""
    summary: dict[str, Any] = {
        "created": before is None,
        "bytesBefore": None if before is None else len(before),
        "bytesAfter": len(after),
    }
    if max(len(before or b""), len(after)) > DIFF_MAX_INPUT_BYTES:
        summary.update(linesAdded=None, linesRemoved=None, head="", truncated=True)
        return summary
    old = (before or b"").decode("utf-8", "replace").splitlines(keepends=True)
    new = after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = list(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", n=2))
    added = sum(1 for line in lines[2:] if line.startswith("+"))
    removed = sum(1 for line in lines[2:] if line.startswith("-"))
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    raw = text.encode("utf-8")
    truncated = len(raw) > DIFF_HEAD_BYTES
    head = raw[:DIFF_HEAD_BYTES].decode("utf-8", "ignore") if truncated else text
    summary.update(linesAdded=added, linesRemoved=removed, head=head, truncated=truncated)
    return summary


def clean_text(value: str) -> str:
    """``value`` as valid UTF-8 (lone surrogates become U+FFFD): storage and the journal must
    never be handed text they cannot encode."""
    return value.encode("utf-8", "replace").decode("utf-8") if not value.isascii() else value


def _shorten(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        value = clean_text(value)
        if len(value) > EVENT_STRING_CHARS:
            return value[:EVENT_STRING_CHARS] + f"…({len(value)} chars)"
        return value
    if depth >= 4:
        return "…"
    if isinstance(value, list):
        items = [_shorten(v, depth + 1) for v in value[:20]]
        return items + ([f"…({len(value)} items)"] if len(value) > 20 else [])
    if isinstance(value, dict):
        return {clean_text(str(k)[:64]): _shorten(v, depth + 1) for k, v in list(value.items())[:30]}
    return value


def file_change(call: ToolCall, receipt: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``files.changed`` entry for a call that wrote its primary path, else None."""
    primary = call.path
    if call.write is None or primary is None or not receipt.get("allowed"):
        return None
    change: dict[str, Any] = {
        "path": primary.relative,
        "change": "added" if call.write.before is None else "modified",
        "cause": "tool",
        "receiptId": receipt["receiptId"],
        "toolCallId": call.id,
    }
    if call.write.before_version is not None:
        change["beforeVersion"] = call.write.before_version.to_wire()
    if call.write.after_version is not None:
        change["afterVersion"] = call.write.after_version.to_wire()
    return change


# -- the facade ---------------------------------------------------------------------------------------


class ToolHooks(Protocol):
    """The hooks the facade calls (the plugin host's facades)."""

    def tool_call_veto(self, call: ToolCall) -> str | None: ...

    def tool_call_completed(self, call: ToolCall, receipt: dict[str, Any]) -> None: ...


class ToolFacade:
    def __init__(
        self,
        tools: list[Tool],
        plugins: ToolHooks | None,
        storage: Storage,
        executor: Executor | None,
        journal: Journal | None,
        *,
        workspace_roots: Mapping[str, Path] | None = None,
        workspace_access: WorkspaceAccess | None = None,
    ) -> None:
        self.plugins = plugins
        self.workspace_access = workspace_access or WorkspaceAccess()
        self.storage = storage
        self.executor = executor
        self.journal = journal
        self.workspace_roots = dict(workspace_roots or {})
        self._tools: dict[str, Tool] = {}
        self._validators: dict[str, SchemaValidator] = {}
        self.write_observers: list[WriteObserver] = []
        # Re-resolved on the server when each run starts, whatever a client cached.
        self.disabled_by_run: dict[str, frozenset[str]] = {}
        # Set by the gateway when a plugin implements ``authorize``: asked ``tools:call`` for the
        # run's actor before each call (False refuses it with ``forbidden``).
        self.authorize: Callable[[ToolCall], Awaitable[bool]] | None = None
        for tool in tools:
            if not isinstance(tool, Tool):
                raise TypeError(f"register_tools: expected a gateway.tools.Tool, got {type(tool).__name__}")
            if not TOOL_NAME.match(tool.name):
                raise ValueError(f"tool name {tool.name!r} must match {TOOL_NAME.pattern}")
            if tool.name in self._tools:
                raise ValueError(f"tool {tool.name!r} registered twice")
            # Checked here, once: a bad schema stops the gateway at start-up, naming the tool.
            self._validators[tool.name] = compile_schema(tool.input_schema, f"tool {tool.name!r}: input_schema")
            self._tools[tool.name] = tool

    @property
    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    def scope_for(self, run: Run, **kwargs: Any) -> RunScope:
        """A :class:`RunScope` for ``run`` with the configured workspace directories and the
        capabilities the run manager resolved as disabled when the run started."""
        kwargs.setdefault("disabled_capabilities", self.disabled_by_run.get(run.host_run_id, frozenset()))
        return RunScope.for_run(run, self.workspace_roots, **kwargs)

    def _enabled(self, tool: Tool, scope: RunScope) -> bool:
        return not (set(tool.capability_ids) & scope.disabled_capabilities)

    def list_tools(self, scope: RunScope) -> list[dict[str, Any]]:
        """MCP-style descriptions of the tools this run may call."""
        return [t.describe() for t in self._tools.values() if self._enabled(t, scope) and not t.internal]

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def call(self, name: str, arguments: Any, scope: RunScope, caller: str = "mcp") -> dict[str, Any]:
        """Run one tool call through the whole pipeline; returns the handler's result plus its
        ``receiptId``. Raises :class:`ToolError` (with ``receipt_id`` set) when refused or failed."""
        tool = self._tools.get(name)
        args = arguments if isinstance(arguments, dict) else {}
        call = ToolCall("tc_" + secrets.token_hex(8), name, tool, args, scope, caller, self.executor)
        started = False
        requested_path: str | None = None
        try:
            if not self.workspace_access.allows(scope.actor_id, scope.workspace_id):
                # Runs are refused another actor's workspace; this holds for any other caller too,
                # and says no more than a workspace that is not configured would.
                raise ToolError("no_workspace", f"no configured workspace {scope.workspace_id[:80]!r}")
            if tool is None:
                known = ", ".join(sorted(t.name for t in self._tools.values() if self._enabled(t, scope)))
                raise ToolError("unknown_tool", f"no tool named {name[:80]!r} (available: {known})")
            if not self._enabled(tool, scope):
                off = ", ".join(sorted(set(tool.capability_ids) & scope.disabled_capabilities))
                raise ToolError("capability_disabled", f"{tool.name} needs capability {off}, disabled for this run")
            if self.authorize is not None:
                try:
                    allowed = await self.authorize(call)
                except Exception as exc:  # a broken policy plugin fails closed, as a veto does
                    log.exception("authorize raised for tools:call %s", name)
                    raise ToolError("forbidden", f"an authorize hook failed ({type(exc).__name__}); refused") from exc
                if not allowed:
                    raise ToolError("forbidden", f"actor {scope.actor_id[:80]!r} may not tools:call {tool.name}")
            if not isinstance(arguments, dict):
                raise ToolError("invalid_arguments", f"arguments must be an object, got {type_name(arguments)}")
            _raise_invalid(self._validators[tool.name], arguments, "arguments")
            named: dict[str, str | None] = {key: arguments.get(key) for key in tool.path_arguments if key in arguments}
            if tool.scope_paths is not None:
                named.update(tool.scope_paths(scope))
            for key, raw in named.items():
                requested_path = raw if isinstance(raw, str) else None
                if raw is None:
                    raise ToolError("not_found", f"this run has no {key} (it is not in the run's context)")
                call.paths[key] = await self._thread(
                    lambda raw=raw: resolve_path(
                        scope.workspace_root, scope.allowed_roots, raw, must_exist=tool.path_must_exist
                    )
                )
            requested_path = None
            if tool.writes and call.path is not None:
                await self._check_version(call)
        except (ToolError, PathError) as exc:
            error = exc if isinstance(exc, ToolError) else ToolError(exc.code, str(exc))
            await self._refused(call, error, False, requested_path)
            raise error from (None if exc is error else exc)
        watched = self._write_started(call) if tool.writes and call.path is not None else []
        change: dict[str, Any] | None = None
        try:
            try:
                await self._started(call)
                started = True
                try:
                    reason = self.plugins.tool_call_veto(call) if self.plugins is not None else None
                except Exception as exc:  # a broken policy plugin fails closed
                    log.exception("tool_call_veto raised for %s", name)
                    reason = f"a veto hook failed ({type(exc).__name__}); refused to be safe"
                if reason:
                    raise ToolError("vetoed", str(reason))
                result = await tool.handler(call)
                if not isinstance(result, dict):
                    raise ToolError("handler_failed", f"{tool.name} returned {type(result).__name__}, not an object")
            except (ToolError, PathError) as exc:
                error = exc if isinstance(exc, ToolError) else ToolError(exc.code, str(exc))
                await self._refused(call, error, started, requested_path)
                raise error from (None if exc is error else exc)
            except Exception as exc:
                log.exception("tool %s failed", name)
                error = ToolError("handler_failed", f"{name} failed: {type(exc).__name__}: {str(exc)[:300]}")
                await self._refused(call, error, started, requested_path, status="failed")
                raise error from exc
            receipt = await self._receipt(call, allowed=True, reason=None, code=None, status="completed")
            await self._completed_event(call, receipt, None)
            change = file_change(call, receipt)
            if change is not None:
                # On the calling run, before the call returns: the run cannot end before it.
                await self._emit(call, "files.changed", {"workspaceId": call.scope.workspace_id, "changes": [change]})
            return {**result, "receiptId": receipt["receiptId"]}
        finally:
            for observer in watched:
                try:
                    await observer.write_ended(call, change)
                except Exception:
                    log.exception("a write observer failed after %s", name)

    def _write_started(self, call: ToolCall) -> list[WriteObserver]:
        """Tell the write observers a write may happen; returns those told (each gets its end)."""
        told: list[WriteObserver] = []
        for observer in self.write_observers:
            try:
                observer.write_started(call)
            except Exception:
                log.exception("a write observer failed before %s", call.name)
                continue
            told.append(observer)
        return told

    async def _check_version(self, call: ToolCall) -> None:
        resolved = call.path
        assert resolved is not None
        version = await self._thread(current_version, resolved) if resolved.exists else None
        call.before_version = version
        expected_hash = call.arguments.get("expectedHash")
        expected_mtime = call.arguments.get("expectedMtime")
        if expected_hash is None and expected_mtime is None:
            return
        if version is None:
            raise ToolError("stale_version", f"{resolved.relative!r} does not exist, but an expected version was given")
        if expected_hash is not None and str(expected_hash).lower() != version.sha256:
            raise ToolError(
                "stale_version",
                f"{resolved.relative!r} changed since it was read: expected sha256 {str(expected_hash)[:12]}…, "
                f"the file now has {version.sha256[:12]}…; read it again; nothing was written",
            )
        if expected_mtime is not None and expected_mtime != version.mtime_ns:
            raise ToolError(
                "stale_version",
                f"{resolved.relative!r} changed since it was read: expected mtime {expected_mtime} ns, "
                f"the file has {version.mtime_ns} ns; read it again; nothing was written",
            )

    async def _refused(
        self, call: ToolCall, error: ToolError, started: bool, requested_path: str | None, status: str = "denied"
    ) -> None:
        if not started:
            await self._started(call)
        receipt = await self._receipt(
            call, allowed=False, reason=error.message, code=error.code, status=status, requested_path=requested_path
        )
        error.receipt_id = receipt["receiptId"]
        await self._completed_event(call, receipt, error)

    async def _receipt(
        self,
        call: ToolCall,
        *,
        allowed: bool,
        reason: str | None,
        code: str | None,
        status: str,
        requested_path: str | None = None,
    ) -> dict[str, Any]:
        scope = call.scope
        primary = call.path
        diff = None
        if call.write is not None and primary is not None:
            diff = await self._thread(diff_summary, call.write.before, call.write.after, primary.relative)
        receipt: dict[str, Any] = {
            "schema": RECEIPT_SCHEMA,
            "receiptId": "rcpt_" + secrets.token_hex(12),
            "source": "gateway",
            "agentId": scope.run.agent_id,
            "toolCallId": call.id,
            "hostRunId": scope.run.host_run_id,
            "actorId": scope.actor_id,
            "workspaceId": scope.workspace_id,
            "root": primary.root if primary else None,
            "page": scope.page,
            "targetSnapshotHash": scope.run.target_snapshot_hash,
            "tool": clean_text(call.name[:100]),
            "path": primary.relative if primary else None,
            "allowed": allowed,
            "status": status,
            "errorCode": code,
            "reason": clean_text(reason) if reason is not None else None,
            "diffSummary": diff,
            "beforeVersion": call.before_version.to_wire() if call.before_version else None,
            "afterVersion": call.after_version.to_wire() if call.after_version else None,
            "agentSessionId": scope.agent_session_id,
            "model": scope.model,
            "caller": call.caller,
            "createdAt": now_ms(),
        }
        if requested_path is not None and primary is None:
            receipt["requestedPath"] = _shorten(requested_path)
        if call.note is not None:
            receipt["note"] = clean_text(call.note[:NOTE_CHARS])
        await self._thread(self.storage.insert_receipt, receipt)
        if self.plugins is not None:
            try:
                self.plugins.tool_call_completed(call, receipt)
            except Exception:
                log.exception("tool_call_completed hook failed for %s", call.name)
        return receipt

    # -- journal events -------------------------------------------------------------------------------
    def _event_arguments(self, call: ToolCall) -> dict[str, Any]:
        shown = {clean_text(str(k)[:64]): _shorten(v) for k, v in list(call.arguments.items())[:30]}
        for key, resolved in call.paths.items():
            if key in shown:
                shown[key] = resolved.relative
        return shown

    async def _emit(self, call: ToolCall, kind: str, payload: dict[str, Any]) -> None:
        journal = self.journal
        run_id = call.scope.run.host_run_id
        if journal is None or not journal.is_open(run_id):
            return
        try:
            await journal.append(run_id, kind, payload, "tool")
        except Exception:
            log.exception("could not append %s for run %s", kind, run_id)

    async def _started(self, call: ToolCall) -> None:
        await self._emit(
            call,
            "tool.started",
            {
                "toolCallId": call.id,
                "tool": clean_text(call.name[:100]),
                "caller": call.caller,
                "arguments": self._event_arguments(call),
            },
        )

    async def _completed_event(self, call: ToolCall, receipt: dict[str, Any], error: ToolError | None) -> None:
        payload: dict[str, Any] = {
            "toolCallId": call.id,
            "tool": clean_text(call.name[:100]),
            "status": "failed" if error else "completed",
            "receiptId": receipt["receiptId"],
            "path": receipt["path"],
        }
        if receipt["diffSummary"] is not None:
            diff = receipt["diffSummary"]
            payload["diffSummary"] = {k: diff[k] for k in ("created", "linesAdded", "linesRemoved")}
        if error is not None:
            payload["error"] = {"code": error.code, "message": clean_text(error.message)}
        await self._emit(call, "tool.completed", payload)
