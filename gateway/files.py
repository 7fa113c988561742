"""ACP `fs/read_text_file` and `fs/write_text_file`, served through the tool facade.

An agent's file requests take the same way as every tool call: argument validation, path
normalisation, the run's allowed roots, veto hooks, a receipt and `tool.*` events. ACP paths are
absolute; they must resolve inside the run's allowed roots of the workspace directory.
"""

from __future__ import annotations

from typing import Any

from agent_gateway.paths import read_file_versioned, write_file_atomically
from agent_gateway.tools import Tool, ToolCall, ToolError, ToolFacade

READ_TOOL = "fs.read_text_file"
WRITE_TOOL = "fs.write_text_file"
CAPABILITY_READ = "files.read"
CAPABILITY_WRITE = "files.write"
MAX_BYTES = 8 * 1024 * 1024


async def _read(call: ToolCall) -> dict[str, Any]:
    resolved = call.paths["path"]
    data, version = await call.in_thread(read_file_versioned, resolved, MAX_BYTES)
    call.record_read(version)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError("not_text", f"{resolved.relative!r} is not UTF-8 text") from exc
    line, limit = call.arguments.get("line"), call.arguments.get("limit")
    if line is not None or limit is not None:
        lines = text.splitlines(keepends=True)
        start = max(int(line or 1), 1) - 1
        text = "".join(lines[start : start + int(limit)] if limit is not None else lines[start:])
    return {"content": text}


async def _write(call: ToolCall) -> dict[str, Any]:
    resolved = call.paths["path"]
    data = str(call.arguments["content"]).encode("utf-8")
    if len(data) > MAX_BYTES:
        raise ToolError("too_large", f"{len(data)} bytes; the limit is {MAX_BYTES}")
    before: bytes | None = None
    before_version = None
    if resolved.exists:
        before, before_version = await call.in_thread(read_file_versioned, resolved, MAX_BYTES)
    after = await call.in_thread(lambda: write_file_atomically(resolved, data))
    call.record_write(before, data, before_version, after)
    return {"path": resolved.relative, "version": after.to_wire()}


FS_TOOLS = (
    Tool(
        READ_TOOL,
        "ACP fs/read_text_file: read a text file inside the run's allowed roots.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string", "maxLength": 4096},
                "line": {"type": ["integer", "null"], "minimum": 1},
                "limit": {"type": ["integer", "null"], "minimum": 0},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        (CAPABILITY_READ,),
        _read,
        path_arguments=("path",),
        internal=True,
    ),
    Tool(
        WRITE_TOOL,
        "ACP fs/write_text_file: write a text file inside the run's allowed roots (atomic).",
        {
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 4096}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        (CAPABILITY_WRITE,),
        _write,
        path_arguments=("path",),
        writes=True,
        path_must_exist=False,
        internal=True,
    ),
)


class AgentFiles:
    """What runtimes reach as `turn.files`."""

    def __init__(self, facade: ToolFacade) -> None:
        self.facade = facade

    def _scope(self, turn: Any) -> Any:
        if turn is None:
            raise ToolError("no_run", "file access is only possible during a run")
        binding = getattr(turn, "binding", None)
        session_id = getattr(binding, "agent_session_id", None)
        return self.facade.scope_for(turn.run, agent_session_id=session_id)

    async def read_text(self, turn: Any, path: str, line: int | None = None, limit: int | None = None) -> str:
        arguments: dict[str, Any] = {"path": path}
        if line is not None:
            arguments["line"] = line
        if limit is not None:
            arguments["limit"] = limit
        result = await self.facade.call(READ_TOOL, arguments, self._scope(turn), caller="acp.fs")
        return str(result["content"])

    async def write_text(self, turn: Any, path: str, content: str) -> None:
        await self.facade.call(WRITE_TOOL, {"path": path, "content": content}, self._scope(turn), caller="acp.fs")
