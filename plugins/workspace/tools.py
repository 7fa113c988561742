"""The workspace tools: current page, selection, allowed roots, read / patch / write a file, note.

Every handler runs after the facade has validated the arguments, resolved and checked the paths
(``call.paths``), checked the caller's expected version and asked the veto hooks. File I/O goes
through :mod:`agent_gateway.paths` only, so a symlink swapped in after the check is never followed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_gateway import (
    ResolvedPath,
    RunScope,
    Tool,
    ToolCall,
    ToolError,
    allowed_roots_of,
    read_file_versioned,
    write_file_atomically,
)

from .patching import PatchError, apply_edits, apply_unified_diff

CAP_READ = "workspace.read"
CAP_WRITE = "workspace.write"
CAP_NOTE = "workspace.note"

PATH_SCHEMA = {"type": "string", "minLength": 1, "maxLength": 4096, "description": "Path relative to the workspace"}
HASH_SCHEMA = {
    "type": ["string", "null"],
    "pattern": "^[0-9a-fA-F]{64}$",
    "description": "sha256 (hex) of the file as you last read it (version.sha256 from workspace.read_file)",
}
MTIME_SCHEMA = {"type": ["integer", "null"], "minimum": 0, "description": "version.mtimeNs as you last read it"}


@dataclass
class Settings:
    max_read_bytes: int = 1_048_576
    max_write_bytes: int = 1_048_576
    max_edits: int = 100


def _decode(data: bytes, relative: str) -> str:
    if b"\x00" in data:
        raise ToolError("not_text", f"{relative!r} looks binary (it contains NUL bytes); only UTF-8 text can be read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError("not_text", f"{relative!r} is not valid UTF-8 (bad byte at offset {exc.start})") from exc


class WorkspaceTools:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def _read_text(self, call: ToolCall, resolved: ResolvedPath) -> tuple[str, Any]:
        data, version = await call.in_thread(read_file_versioned, resolved, self.settings.max_read_bytes)
        call.record_read(version)
        return _decode(data, resolved.relative), version

    # -- reads ------------------------------------------------------------------------------------
    async def read_current_page(self, call: ToolCall) -> dict[str, Any]:
        resolved = call.paths["page"]
        text, version = await self._read_text(call, resolved)
        return {"path": resolved.relative, "text": text, "version": version.to_wire()}

    async def read_selection(self, call: ToolCall) -> dict[str, Any]:
        selection = call.scope.selection
        frozen = None
        if selection is not None:
            frozen = {"text": selection.get("text"), "from": selection.get("from"), "to": selection.get("to")}
        return {"path": call.scope.page, "selection": frozen, "targetSnapshotHash": call.scope.run.target_snapshot_hash}

    async def describe_roots(self, call: ToolCall) -> dict[str, Any]:
        scope = call.scope
        if scope.workspace_root is None:
            return {"workspaceId": scope.workspace_id, "configured": False, "roots": [], "page": scope.page}
        described = await call.in_thread(allowed_roots_of, scope.workspace_root, scope.allowed_roots)
        roots = []
        for root in described:
            entry: dict[str, Any] = {"root": root.label or ".", "usable": root.absolute is not None}
            if root.problem:
                entry["problem"] = root.problem
            roots.append(entry)
        return {
            "workspaceId": scope.workspace_id,
            "configured": True,
            "roots": roots,
            "page": scope.page,
            "writable": CAP_WRITE not in scope.disabled_capabilities,
            "shell": False,
            "note": "paths are relative to the workspace; only files below a usable root can be used",
        }

    async def read_file(self, call: ToolCall) -> dict[str, Any]:
        resolved = call.paths["path"]
        text, version = await self._read_text(call, resolved)
        return {"path": resolved.relative, "text": text, "version": version.to_wire()}

    # -- writes -----------------------------------------------------------------------------------
    async def _write(self, call: ToolCall, resolved: ResolvedPath, before: bytes | None, text: str, **kw: Any) -> Any:
        data = text.encode("utf-8")
        if len(data) > self.settings.max_write_bytes:
            raise ToolError(
                "too_large", f"the new content is {len(data)} bytes; the limit is {self.settings.max_write_bytes}"
            )
        after = await call.in_thread(lambda: write_file_atomically(resolved, data, **kw))
        call.record_write(before, data, call.before_version, after)
        return after

    async def patch_file(self, call: ToolCall) -> dict[str, Any]:
        resolved = call.paths["path"]
        arguments = call.arguments
        edits = arguments.get("edits")
        if edits is not None and len(edits) > self.settings.max_edits:
            raise ToolError("invalid_arguments", f"at most {self.settings.max_edits} edits per call")
        checked = call.before_version
        data, version = await call.in_thread(read_file_versioned, resolved, self.settings.max_read_bytes)
        if checked is not None and version.sha256 != checked.sha256:
            raise ToolError("stale_version", f"{resolved.relative!r} changed during the call; nothing was written")
        call.before_version = version
        text = _decode(data, resolved.relative)
        try:
            new_text = (
                apply_edits(text, edits) if edits is not None else apply_unified_diff(text, arguments["unifiedDiff"])
            )
        except PatchError as exc:
            raise ToolError("patch_failed", f"{resolved.relative}: {exc}; nothing was written") from exc
        if new_text == text:
            return {"path": resolved.relative, "changed": False, "version": version.to_wire()}
        after = await self._write(call, resolved, data, new_text, expected_sha256=version.sha256)
        return {"path": resolved.relative, "changed": True, "version": after.to_wire()}

    async def write_file(self, call: ToolCall) -> dict[str, Any]:
        resolved = call.paths["path"]
        arguments = call.arguments
        expected = arguments.get("expectedHash") is not None or arguments.get("expectedMtime") is not None
        if call.before_version is None:
            if expected:  # the facade refuses this already; kept for direct callers
                raise ToolError("stale_version", f"{resolved.relative!r} does not exist")
            after = await self._write(call, resolved, None, arguments["text"], must_not_exist=True)
            return {"path": resolved.relative, "created": True, "version": after.to_wire()}
        if not expected:
            raise ToolError(
                "already_exists",
                f"{resolved.relative!r} already exists; pass expectedHash (from workspace.read_file) to replace it, "
                "or use workspace.patch_file",
            )
        before, version = await call.in_thread(read_file_versioned, resolved, None)
        if version.sha256 != call.before_version.sha256:
            raise ToolError("stale_version", f"{resolved.relative!r} changed during the call; nothing was written")
        after = await self._write(call, resolved, before, arguments["text"], expected_sha256=version.sha256)
        return {"path": resolved.relative, "created": False, "version": after.to_wire()}

    async def write_receipt_note(self, call: ToolCall) -> dict[str, Any]:
        call.note = call.arguments["note"]
        return {"recorded": True}

    # -- registration -------------------------------------------------------------------------------
    def tools(self) -> list[Tool]:
        empty = {"type": "object", "properties": {}, "additionalProperties": False}

        def page(scope: RunScope) -> dict[str, str | None]:
            return {"page": scope.page}

        edit = {
            "type": "object",
            "properties": {
                "search": {"type": "string", "minLength": 1, "description": "exact text, must occur exactly once"},
                "replace": {"type": "string"},
            },
            "required": ["search", "replace"],
            "additionalProperties": False,
        }
        return [
            Tool(
                "workspace.read_current_page",
                "Read the page the user has open (the run's context target): text and version.",
                empty,
                (CAP_READ,),
                self.read_current_page,
                scope_paths=page,
            ),
            Tool(
                "workspace.read_selection",
                "The user's selection on the current page, as frozen when the run started: {text, from, to}.",
                empty,
                (CAP_READ,),
                self.read_selection,
            ),
            Tool(
                "workspace.describe_roots",
                "The workspace id and the roots (relative paths) this run may read and write below.",
                empty,
                (CAP_READ,),
                self.describe_roots,
            ),
            Tool(
                "workspace.read_file",
                "Read a UTF-8 text file below an allowed root. Returns its text and version "
                "{sha256, mtimeNs, size}; pass version.sha256 as expectedHash when you patch it.",
                {
                    "type": "object",
                    "properties": {"path": PATH_SCHEMA},
                    "required": ["path"],
                    "additionalProperties": False,
                },
                (CAP_READ,),
                self.read_file,
                path_arguments=("path",),
            ),
            Tool(
                "workspace.patch_file",
                "Change an existing text file: either `edits` (exact search/replace blocks, each search "
                "matching exactly once) or `unifiedDiff`. With expectedHash (or expectedMtime) the patch "
                "is refused when the file changed since you read it.",
                {
                    "type": "object",
                    "properties": {
                        "path": PATH_SCHEMA,
                        "expectedHash": HASH_SCHEMA,
                        "expectedMtime": MTIME_SCHEMA,
                        "edits": {"type": "array", "items": edit, "minItems": 1},
                        "unifiedDiff": {"type": "string", "minLength": 1},
                    },
                    "required": ["path"],
                    "additionalProperties": False,
                    "oneOf": [{"required": ["edits"]}, {"required": ["unifiedDiff"]}],
                },
                (CAP_WRITE,),
                self.patch_file,
                path_arguments=("path",),
                writes=True,
            ),
            Tool(
                "workspace.write_file",
                "Create a new text file (leave expectedHash out), or replace an existing one (expectedHash "
                "or expectedMtime of the version you read is then required).",
                {
                    "type": "object",
                    "properties": {
                        "path": PATH_SCHEMA,
                        "text": {"type": "string", "maxLength": self.settings.max_write_bytes},
                        "expectedHash": HASH_SCHEMA,
                        "expectedMtime": MTIME_SCHEMA,
                    },
                    "required": ["path", "text"],
                    "additionalProperties": False,
                },
                (CAP_WRITE,),
                self.write_file,
                path_arguments=("path",),
                writes=True,
                path_must_exist=False,
            ),
            Tool(
                "workspace.write_receipt_note",
                "Record a short note in the run's audit trail (a tool receipt), e.g. why you changed a file.",
                {
                    "type": "object",
                    "properties": {"note": {"type": "string", "minLength": 1, "maxLength": 2000}},
                    "required": ["note"],
                    "additionalProperties": False,
                },
                (CAP_NOTE,),
                self.write_receipt_note,
            ),
        ]


__all__ = ["CAP_NOTE", "CAP_READ", "CAP_WRITE", "Settings", "WorkspaceTools"]
