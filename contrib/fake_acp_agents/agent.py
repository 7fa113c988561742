"""Fake ACP agents built on the official SDK (``agent-client-protocol``, import ``acp``).

Run as ``python contrib/fake_acp_agents/agent.py --behaviour NAME``. Every behaviour
answers ``initialize``, ``session/new``, ``session/list``, ``session/resume``,
``session/close``, ``session/set_mode`` and ``session/set_config_option``; a
plain prompt is answered by streaming one thought chunk and then
``"echo: <prompt text>"`` in a few message chunks; the prompt ``history?``
answers with the previous prompts of the session joined by ``|``.
``session/cancel`` ends an in-flight prompt with ``stopReason: cancelled``.
The prompt ``forget me`` is answered, then the agent forgets that session (as an
agent that lost its session store would: its next prompt is refused or an error);
the prompt ``refuse this`` ends at once with ``stopReason: refusal``; the prompt
``hold until cancelled`` streams the thought ``holding`` and then waits for
``session/cancel`` (a turn that stays busy as long as a test wants). A prompt ending
with ``with usage`` also reports usage as Hermes does: a ``usage_update`` ``{used, size}``
and ``usage`` ``{inputTokens, outputTokens, thoughtTokens, cachedReadTokens, totalTokens}``
(words of the prompt and of the reply) in the prompt's result.

Behaviours:

``basic``
    ``loadSession: false``; ``session/load`` is "method not found".
``replay``
    ``loadSession: true``; transcripts persist as JSON files in
    ``$FAKE_ACP_STATE_DIR`` (in memory without it); ``session/load`` replays
    the history as ``user_message_chunk`` + ``agent_message_chunk`` updates
    before answering; loading an unknown id is a ``-32002`` error.
``silent_load``
    ``loadSession: true``; loading an unknown id succeeds with no replay, and a
    prompt on an unknown session ends with ``stopReason: refusal`` (Hermes).
``exit_on_load``
    ``loadSession: true``; ``session/load`` writes a line to stderr and exits
    with code 4 before answering.
``hang_on_load``
    ``loadSession: true``; ``session/load`` is never answered.
``reject_concurrent``
    a second prompt on a session while one runs is a ``-32600`` error
    (Reasonix); other behaviours queue it behind the first.
``permission``
    reports a ``tool_call``, asks ``session/request_permission`` with options
    ``allow_once`` / ``reject_once``, completes or fails the tool call and
    replies ``"permission: <optionId or cancelled>"``.
``crash``
    streams a few chunks, writes to stderr and exits with code 3 mid-turn.
``flood``
    ``"flood N"`` streams N ``"x"`` chunks, then ``end_turn``; ``"flood N numbered"``
    streams ``"0,"``, ``"1,"``, ... instead (to check ordering).
``weird``
    emits an unknown ``sessionUpdate`` kind (``teapot_update``, written as a
    raw line because the SDK refuses it) and ends with ``stopReason: teapot``;
    the prompt ``big`` streams a single 5 MB chunk instead.
``stderr_flood``
    writes 5 MB to stderr before answering ``initialize``.
``fs``
    ``"read <path>"`` calls ``fs/read_text_file``; ``"write <path> <text>"``
    calls ``fs/write_text_file``; the reply reports the result or the error.
``mcp``
    an MCP client of the first server given in ``session/new`` / ``session/load``
    (``mcpServers``): stdio (spawns ``command`` + ``args`` with ``env``) or HTTP
    (POSTs to ``url`` with ``headers``), plain JSON-RPC (``initialize``,
    ``notifications/initialized``, then the request). ``"call <tool> <json-arguments>"``
    reports a ``tool_call`` (kind ``search`` for query/search/list tools, else
    ``fetch``; status ``pending``) and a ``tool_call_update`` (``completed``, or
    ``failed`` when the result has ``isError``, with the result text as content),
    then streams the result's text (the tool's JSON) as the reply; ``"list"``
    replies with the tool names, one a line. An MCP or transport error is the
    reply ``"mcp error: ..."`` (the turn still ends with ``end_turn``).

Every behaviour also answers the prompt ``native <json>`` (the message after any gateway
preamble) by reporting tool calls it "runs itself", as raw ``session/update`` lines: for each of
``{"calls": [{"kind", "title", "locations"?, "rawInput"?, "updates"?: [{...}], "final"?}], "repeat"?:
N, "padTitle"?: N}`` it sends a ``tool_call`` (status ``pending``, the title followed by ``padTitle``
``t`` characters), then each of ``updates`` as a ``tool_call_update``, then a ``tool_call_update``
with status ``final`` (default ``completed``; null: the call is left unfinished) and a ``rawOutput``;
the whole list ``repeat`` times (ids ``native-<turn>-<round>-<index>``, or the call's ``id``). The
reply is ``native: <count> calls``; ``"then": "<prompt>"`` goes on with that prompt's work in the
same turn (e.g. ``call <tool> <json>`` with the ``mcp`` behaviour).

Every behaviour also answers ``probe <json>`` by trying, with the agent's own powers, what a hostile
prompt would ask of it, and replying ``probe: <json>`` with what each attempt gave (``ok:...`` or
``error:<exception>:...``): ``{"read": [paths], "write": {path: text}, "listdir": [paths],
"connect": [[host, port]], "http": [[url, {headers}]], "env": [names], "whoami": true, "pids":
true}`` (the sandbox tests).

``--session-delete`` makes any behaviour declare ``sessionCapabilities.delete`` and answer
``session/delete`` (forgets the session and removes its state file; an unknown id is ``-32002``).
Without it ``session/delete`` is "method not found".

``--mcp-http`` makes any behaviour declare ``mcpCapabilities.http`` (the client then
offers HTTP MCP servers); without it only stdio is declared.

``FAKE_ACP_DELAY`` (or ``--delay``) adds that many seconds before each message
chunk (cancellable), to make turns slow.

Arguments it does not know (``--version``, ...) are ignored: the process stays an
ACP agent reading stdin, as agents without a version option do. ``FAKE_ACP_STARTED``
(a file path): every process start appends a JSON line ``{"pid", "argv",
"stdinIsDevNull"}``. ``FAKE_ACP_HOLD`` (a FIFO path): a process started with
``--version`` first reads that FIFO to its end (it stays blocked until the test
writes to it and closes it), standing for an agent that never answers a version
probe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import pydantic

if __name__ == "__main__":
    # The suite starts this agent about 160 times. Importing the SDK builds its ~270 pydantic
    # models and reads every field's docstring from the source: about 0.25 s of CPU per start,
    # for descriptions this agent never shows. Run as a program (nothing else shares this
    # process's pydantic), the models are built on first use instead, with the same validation,
    # and field docstrings are not read (a private hook: where a pydantic lacks it, they are).
    pydantic.BaseModel.model_config = pydantic.ConfigDict(defer_build=True)
    with contextlib.suppress(ImportError):
        from pydantic._internal import _fields

        _fields.extract_docstrings_from_cls = lambda cls, use_inspect=False: {}

from acp import (
    RequestError,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.interfaces import Agent, Client
from acp.schema import (
    AgentCapabilities,
    AllowedOutcome,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    McpCapabilities,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionDeleteCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionResumeCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    ToolCallUpdate,
)

BEHAVIOURS: tuple[str, ...] = (
    "basic",
    "replay",
    "silent_load",
    "exit_on_load",
    "hang_on_load",
    "reject_concurrent",
    "permission",
    "crash",
    "flood",
    "weird",
    "stderr_flood",
    "fs",
    "mcp",
)
BIG_CHUNK_BYTES = 5 * 1024 * 1024
STDERR_FLOOD_BYTES = 5 * 1024 * 1024
CRASH_EXIT_CODE = 3
LOAD_EXIT_CODE = 4
LOADING_BEHAVIOURS = ("replay", "silent_load", "exit_on_load", "hang_on_load")
MODELS: tuple[str, ...] = ("fake-small", "fake-large")
MCP_PROTOCOL_VERSION = "2025-06-18"
MCP_TIMEOUT = 120.0  # seconds for one MCP exchange (a knowledge query may be slow)
MCP_LINE_LIMIT = 64 * 1024 * 1024  # one stdio MCP message is one line; results may be large


@dataclass
class SessionState:
    session_id: str
    cwd: str
    history: list[dict[str, str]] = field(default_factory=list)
    model: str = MODELS[0]
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: bool = False


class Cancelled(Exception):
    """The client sent ``session/cancel`` for the running turn."""


class FakeAgent:
    """One ACP agent whose behaviour is chosen by name (see the module docstring)."""

    def __init__(
        self,
        behaviour: str,
        *,
        delay: float = 0.0,
        state_dir: str | None = None,
        mcp_http: bool = False,
        session_delete: bool = False,
    ) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        self.behaviour = behaviour
        self.delay = delay
        self.state_dir = Path(state_dir) if state_dir else None
        self.mcp_http = mcp_http
        self.session_delete = session_delete
        self.sessions: dict[str, SessionState] = {}
        # The mcpServers given in session/new or session/load, by session id (plain dicts).
        self.mcp_servers: dict[str, list[dict[str, Any]]] = {}
        self.conn: Client | None = None

    # ------------------------------------------------------------------ plumbing

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    @property
    def client(self) -> Client:
        assert self.conn is not None, "not connected"
        return self.conn

    async def _say(self, session_id: str, update: Any) -> None:
        await self.client.session_update(session_id=session_id, update=update)

    async def _raw_update(self, session_id: str, update: dict[str, Any]) -> None:
        """Send a ``session/update`` the SDK's models would refuse, in order with the rest."""
        inner = getattr(self.client, "_conn", None)
        params = {"sessionId": session_id, "update": update}
        if inner is not None:
            await inner.send_notification("session/update", params)
        else:  # pragma: no cover - SDK internals moved: write the line ourselves
            line = json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params})
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    async def _pause(self, state: SessionState) -> None:
        """Wait ``delay`` seconds, or raise :class:`Cancelled` as soon as the turn is cancelled."""
        if state.cancel.is_set():
            raise Cancelled
        if self.delay <= 0:
            return
        try:
            await asyncio.wait_for(state.cancel.wait(), self.delay)
        except TimeoutError:
            return
        raise Cancelled

    def _state_file(self, session_id: str) -> Path | None:
        if self.state_dir is None or self.behaviour != "replay":
            return None
        safe = "".join(ch for ch in session_id if ch.isalnum() or ch in "-_")
        return self.state_dir / f"{safe}.json"

    def _persist(self, state: SessionState) -> None:
        path = self._state_file(state.session_id)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"sessionId": state.session_id, "cwd": state.cwd, "history": state.history}))
        tmp.replace(path)

    def _restore(self, session_id: str) -> SessionState | None:
        if session_id in self.sessions:
            return self.sessions[session_id]
        path = self._state_file(session_id)
        if path is None or not path.exists():
            return None
        data = json.loads(path.read_text())
        state = SessionState(session_id, str(data.get("cwd", "")), list(data.get("history", [])))
        self.sessions[session_id] = state
        return state

    # ------------------------------------------------------------------ ACP agent methods

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **kwargs: Any
    ) -> InitializeResponse:
        if self.behaviour == "stderr_flood":
            line = b"fake agent: very chatty diagnostics " + b"." * 990 + b"\n"
            for _ in range(STDERR_FLOOD_BYTES // len(line) + 1):
                sys.stderr.buffer.write(line)
            sys.stderr.buffer.write(b"fake agent: stderr flood done\n")
            sys.stderr.buffer.flush()
        return InitializeResponse(
            protocol_version=1,
            agent_capabilities=AgentCapabilities(
                load_session=self.behaviour in LOADING_BEHAVIOURS,
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=True),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                    delete=SessionDeleteCapabilities() if self.session_delete else None,
                ),
                mcp_capabilities=McpCapabilities(http=self.mcp_http),
            ),
            agent_info=Implementation(name=f"fake-acp-{self.behaviour}", title="Fake ACP agent", version="0.1"),
        )

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        state = SessionState(f"fake-{uuid.uuid4().hex[:12]}", cwd)
        self.sessions[state.session_id] = state
        self.mcp_servers[state.session_id] = _plain_servers(mcp_servers)
        self._persist(state)
        return NewSessionResponse(session_id=state.session_id, config_options=[self._model_option(state)])

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse | None:
        if self.behaviour not in LOADING_BEHAVIOURS:
            raise RequestError.method_not_found("session/load")
        if self.behaviour == "exit_on_load":
            sys.stderr.write(f"fake agent: exiting in session/load of {session_id}\n")
            sys.stderr.flush()
            os._exit(LOAD_EXIT_CODE)
        if self.behaviour == "hang_on_load":
            await asyncio.Event().wait()  # never answered
        self.mcp_servers[session_id] = _plain_servers(mcp_servers)
        state = self._restore(session_id)
        if state is None:
            if self.behaviour == "silent_load":
                return LoadSessionResponse()
            raise RequestError.resource_not_found(session_id)
        for turn in state.history:
            await self._say(session_id, update_user_message_text(turn["user"]))
            await self._say(session_id, update_agent_message_text(turn["agent"]))
        return LoadSessionResponse(config_options=[self._model_option(state)])

    async def resume_session(
        self, session_id: str, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> ResumeSessionResponse:
        if self._restore(session_id) is None:
            raise RequestError.resource_not_found(session_id)
        return ResumeSessionResponse()

    async def close_session(self, session_id: str, **kwargs: Any) -> None:
        self.sessions.pop(session_id, None)
        self.mcp_servers.pop(session_id, None)

    async def delete_session(self, session_id: str) -> dict[str, Any]:
        """``session/delete`` (routed by :func:`_with_session_delete`; the SDK does not route it)."""
        known = self._restore(session_id) is not None
        self.sessions.pop(session_id, None)
        self.mcp_servers.pop(session_id, None)
        path = self._state_file(session_id)
        if path is not None:
            path.unlink(missing_ok=True)
        if not known:
            raise RequestError.resource_not_found(session_id)
        return {}

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        infos = [
            SessionInfo(session_id=s.session_id, cwd=s.cwd, title=s.history[0]["user"][:40] if s.history else None)
            for s in self.sessions.values()
            if cwd is None or s.cwd == cwd
        ]
        return ListSessionsResponse(sessions=infos)

    async def set_session_mode(self, session_id: str, mode_id: str, **kwargs: Any) -> SetSessionModeResponse:
        self._session(session_id)
        await self._raw_update(session_id, {"sessionUpdate": "current_mode_update", "currentModeId": mode_id})
        return SetSessionModeResponse()

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> SetSessionConfigOptionResponse:
        state = self._session(session_id)
        if config_id != "model" or value not in MODELS:
            raise RequestError.invalid_params({"configId": config_id, "value": value})
        state.model = str(value)
        return SetSessionConfigOptionResponse(config_options=[self._model_option(state)])

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        state = self.sessions.get(session_id)
        if state is not None and state.busy:
            state.cancel.set()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> Any:
        state = self.sessions.get(session_id)
        if state is None:
            if self.behaviour == "silent_load":
                return PromptResponse(stop_reason="refusal")
            raise RequestError.resource_not_found(session_id)
        if "".join(getattr(block, "text", "") for block in prompt).strip().endswith("refuse this"):
            return PromptResponse(stop_reason="refusal")
        if self.behaviour == "reject_concurrent" and state.busy:
            raise RequestError(-32600, "a prompt is already running for this session")
        async with state.lock:
            state.busy = True
            state.cancel.clear()
            text = "".join(getattr(block, "text", "") for block in prompt)
            try:
                if text.strip().endswith("traceparent?"):  # the W3C trace context sent in `_meta`
                    reply, stop = f"traceparent: {kwargs.get('traceparent')}", "end_turn"
                    await self._stream(state, reply)
                else:
                    reply, stop = await self._turn(state, text)
            except Cancelled:
                reply, stop = "", "cancelled"
            finally:
                state.busy = False
            state.history.append({"user": text, "agent": reply})
            self._persist(state)
            if text.strip().endswith("forget me"):
                self.sessions.pop(session_id, None)
            result: dict[str, Any] = {"stopReason": stop}
            if text.strip().endswith("with usage"):
                # As Hermes does: the context window in `usage_update`, the turn's tokens in the result.
                given, taken = len(text.split()), len(reply.split())
                context = {"sessionUpdate": "usage_update", "used": given + taken, "size": 1000}
                await self._raw_update(session_id, context)
                result["usage"] = {
                    "inputTokens": given,
                    "outputTokens": taken,
                    "thoughtTokens": 1,
                    "cachedReadTokens": 0,
                    "totalTokens": given + taken,
                }
            return result

    # ------------------------------------------------------------------ turns

    async def _turn(self, state: SessionState, text: str) -> tuple[str, str]:
        sid = state.session_id
        native = await self._native(state, text)
        if native is not None:
            return native
        probe = await self._probe(state, text)
        if probe is not None:
            return probe
        handler = getattr(self, f"_turn_{self.behaviour}", None)
        if handler is not None:
            result = await handler(state, text)
            if result is not None:
                return result
        if text.strip().endswith("hold until cancelled"):
            await self._say(sid, update_agent_thought_text("holding"))
            await state.cancel.wait()
            return "", "cancelled"
        if text.strip() == "history?":
            reply = "|".join(turn["user"] for turn in state.history)
        else:
            reply = f"echo: {text}"
        await self._say(sid, update_agent_thought_text(f"thinking about {text!r}"))
        await self._stream(state, reply)
        return reply, "end_turn"

    async def _stream(self, state: SessionState, reply: str, pieces: int = 3) -> None:
        size = max(1, -(-len(reply) // pieces))
        for start in range(0, len(reply), size):
            await self._pause(state)
            await self._say(state.session_id, update_agent_message_text(reply[start : start + size]))

    async def _turn_permission(self, state: SessionState, text: str) -> tuple[str, str]:
        sid = state.session_id
        call_id = f"call-{len(state.history) + 1}"
        await self._say(
            sid,
            start_tool_call(call_id, "Write notes/today.md", kind="edit", status="pending", raw_input={"text": text}),
        )
        options = [
            PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
            PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
        ]
        response = await self.client.request_permission(
            session_id=sid,
            tool_call=ToolCallUpdate(tool_call_id=call_id, title="Write notes/today.md", kind="edit"),
            options=options,
        )
        outcome = response.outcome
        choice = outcome.option_id if isinstance(outcome, AllowedOutcome) else "cancelled"
        status: Literal["completed", "failed"] = "completed" if choice == "allow_once" else "failed"
        await self._say(sid, update_tool_call(call_id, status=status, raw_output={"outcome": choice}))
        reply = f"permission: {choice}"
        await self._say(sid, update_agent_message_text(reply))
        return reply, "cancelled" if state.cancel.is_set() else "end_turn"

    async def _probe(self, state: SessionState, text: str) -> tuple[str, str] | None:
        """``probe <json>``: try, with the agent's own powers, what a hostile prompt would ask (see
        the module docstring); the reply is one JSON object of what each attempt gave."""
        command = text.strip().split("\n\n")[-1].strip()
        name, _, raw = command.partition(" ")
        if name != "probe":
            return None
        spec = json.loads(raw)
        result = await asyncio.to_thread(run_probe, spec)
        reply = "probe: " + json.dumps(result, sort_keys=True)
        await self._say(state.session_id, update_agent_message_text(reply))
        return reply, "end_turn"

    async def _native(self, state: SessionState, text: str) -> tuple[str, str] | None:
        """``native <json>``: report tool calls the agent ran itself (see the module docstring)."""
        command = text.strip().split("\n\n")[-1].strip()
        name, _, raw = command.partition(" ")
        if name != "native":
            return None
        sid = state.session_id
        spec = json.loads(raw)
        pad = "t" * int(spec.get("padTitle", 0))
        count = 0
        for round_ in range(int(spec.get("repeat", 1))):
            for index, call in enumerate(spec.get("calls") or []):
                call_id = str(call.get("id") or f"native-{len(state.history) + 1}-{round_}-{index}")
                update: dict[str, Any] = {
                    "sessionUpdate": "tool_call",
                    "toolCallId": call_id,
                    "title": str(call.get("title", "")) + pad,
                    "kind": call.get("kind", "other"),
                    "status": "pending",
                }
                for key in ("locations", "rawInput"):
                    if key in call:
                        update[key] = call[key]
                await self._raw_update(sid, update)
                for fields in call.get("updates") or []:
                    await self._raw_update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, **fields})
                final = call.get("final", "completed")
                if final:
                    done = {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": final}
                    await self._raw_update(sid, {**done, "rawOutput": {"output": f"output of {call_id}"}})
                count += 1
        reply = f"native: {count} calls"
        await self._say(sid, update_agent_message_text(reply))
        if spec.get("then"):  # another prompt's work in the same turn (e.g. an MCP call)
            then, stop = await self._turn(state, str(spec["then"]))
            return f"{reply}\n{then}", stop
        return reply, "end_turn"

    async def _turn_crash(self, state: SessionState, text: str) -> tuple[str, str]:
        for piece in ("about ", "to ", "crash"):
            await self._say(state.session_id, update_agent_message_text(piece))
        sys.stdout.flush()
        sys.stderr.write("fake agent: simulated crash in the middle of a turn\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

    async def _turn_flood(self, state: SessionState, text: str) -> tuple[str, str] | None:
        words = text.split()
        if len(words) not in (2, 3) or words[0] != "flood" or not words[1].isdigit():
            return None
        numbered = words[2:] == ["numbered"]
        count = int(words[1])
        for index in range(count):
            if state.cancel.is_set():
                return f"<{index} chunks>", "cancelled"
            await self._say(state.session_id, update_agent_message_text(f"{index}," if numbered else "x"))
        return f"<{count} chunks>", "end_turn"

    async def _turn_weird(self, state: SessionState, text: str) -> tuple[str, str]:
        sid = state.session_id
        if text.strip() == "big":
            await self._say(sid, update_agent_message_text("y" * BIG_CHUNK_BYTES))
            return "<big>", "end_turn"
        await self._say(sid, update_agent_message_text("brewing"))
        await self._raw_update(sid, {"sessionUpdate": "teapot_update", "temperature": 97, "spout": ["short", "stout"]})
        await self._say(sid, update_agent_message_text(" tea"))
        return "brewing tea", "teapot"

    async def _turn_fs(self, state: SessionState, text: str) -> tuple[str, str] | None:
        sid = state.session_id
        words = text.split(" ", 2)
        try:
            if words[0] == "read" and len(words) >= 2:
                result = await self.client.read_text_file(session_id=sid, path=words[1])
                reply = f"read: {result.content}"
            elif words[0] == "write" and len(words) == 3:
                await self.client.write_text_file(session_id=sid, path=words[1], content=words[2])
                reply = f"wrote: {words[1]}"
            else:
                return None
        except RequestError as exc:
            reply = f"fs error: {exc.code} {exc}"
        await self._say(sid, update_agent_message_text(reply))
        return reply, "end_turn"

    async def _turn_mcp(self, state: SessionState, text: str) -> tuple[str, str] | None:
        sid = state.session_id
        command = text.strip().split("\n\n")[-1].strip()  # the message, after any gateway preamble
        name, _, rest = command.partition(" ")
        if name not in ("call", "list"):
            return None
        servers = self.mcp_servers.get(sid) or []
        if name == "list":
            try:
                listed = await self._mcp(state, servers, "tools/list", {})
            except McpFailure as exc:
                return await self._reply(state, f"mcp error: {exc}")
            names = [str(t.get("name")) for t in listed.get("tools") or [] if isinstance(t, dict)]
            return await self._reply(state, "\n".join(names))
        tool, _, raw_args = rest.strip().partition(" ")
        try:
            arguments = json.loads(raw_args) if raw_args.strip() else {}
        except ValueError as exc:
            return await self._reply(state, f"mcp error: the arguments are not JSON: {exc}")
        if not tool or not isinstance(arguments, dict):
            return await self._reply(state, "mcp error: say `call <tool-name> <json-object-arguments>`")
        call_id = f"mcp-{len(state.history) + 1}"
        kind: Literal["search", "fetch"] = "search" if _is_search(tool) else "fetch"
        await self._say(sid, start_tool_call(call_id, tool, kind=kind, status="pending", raw_input=arguments))
        try:
            result = await self._mcp(state, servers, "tools/call", {"name": tool, "arguments": arguments})
        except McpFailure as exc:
            reply = f"mcp error: {exc}"
            await self._say(sid, update_tool_call(call_id, status="failed", content=[tool_content(text_block(reply))]))
            return await self._reply(state, reply)
        except Cancelled:
            await self._say(sid, update_tool_call(call_id, status="failed", raw_output={"cancelled": True}))
            raise
        result_text = "".join(
            str(block.get("text", ""))
            for block in result.get("content") or []
            if isinstance(block, dict) and block.get("type") == "text"
        )
        status: Literal["completed", "failed"] = "failed" if result.get("isError") else "completed"
        await self._say(sid, update_tool_call(call_id, status=status, content=[tool_content(text_block(result_text))]))
        return await self._reply(state, result_text)

    async def _reply(self, state: SessionState, reply: str) -> tuple[str, str]:
        await self._stream(state, reply)
        return reply, "end_turn"

    async def _mcp(
        self, state: SessionState, servers: list[dict[str, Any]], method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        """One MCP request to the session's first server (a fresh connection), cancellable."""
        if not servers:
            raise McpFailure("no MCP server was given in session/new")
        client = McpClient(servers[0])
        work = asyncio.ensure_future(client.exchange(method, params))
        stop = asyncio.ensure_future(state.cancel.wait())
        try:
            done, _ = await asyncio.wait({work, stop}, timeout=MCP_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        if stop in done:
            raise Cancelled
        raise McpFailure(f"{method} got no answer within {MCP_TIMEOUT:g} s")

    # ------------------------------------------------------------------ helpers

    def _session(self, session_id: str) -> SessionState:
        state = self.sessions.get(session_id)
        if state is None:
            raise RequestError.resource_not_found(session_id)
        return state

    @staticmethod
    def _model_option(state: SessionState) -> SessionConfigOptionSelect:
        return SessionConfigOptionSelect(
            id="model",
            name="Model",
            category="model",
            type="select",
            current_value=state.model,
            options=[SessionConfigSelectOption(value=m, name=m) for m in MODELS],
        )


# ---------------------------------------------------------------------- a minimal MCP client


class McpFailure(Exception):
    """The MCP server could not be reached, or answered a JSON-RPC error."""


def _plain_servers(servers: Any) -> list[dict[str, Any]]:
    """The ``mcpServers`` of session/new or session/load as plain ACP-shaped dicts."""
    out = []
    for server in servers or []:
        if hasattr(server, "model_dump"):
            out.append(server.model_dump(by_alias=True, exclude_none=True))
        elif isinstance(server, dict):
            out.append(dict(server))
    return out


def _is_search(tool: str) -> bool:
    last = tool.rsplit(".", 1)[-1].lower()
    return any(word in last for word in ("query", "search", "list", "find"))


def _pairs(items: Any) -> dict[str, str]:
    """ACP ``[{"name", "value"}]`` (env, headers) as a dict."""
    return {str(i["name"]): str(i.get("value", "")) for i in items or [] if isinstance(i, dict) and "name" in i}


class McpClient:
    """One short MCP conversation with an ACP ``mcpServers`` entry: ``initialize``,
    ``notifications/initialized``, one request; then the connection is closed."""

    def __init__(self, server: dict[str, Any]) -> None:
        self.server = server
        self.next_id = 0
        self.session_id: str | None = None
        self.protocol_version = MCP_PROTOCOL_VERSION
        self.negotiated = False
        self.process: asyncio.subprocess.Process | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @property
    def is_http(self) -> bool:
        return self.server.get("type") in ("http", "sse") or ("url" in self.server and "command" not in self.server)

    async def exchange(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        try:
            if not self.is_http:
                await self._spawn()
            init = await self.request(
                "initialize",
                {
                    "protocolVersion": MCP_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "fake-acp-mcp", "version": "0.1"},
                },
            )
            self.protocol_version = str(init.get("protocolVersion") or MCP_PROTOCOL_VERSION)
            self.negotiated = True
            await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            return await self.request(method, params)
        finally:
            await self.close()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        request_id = self.next_id
        answer = await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        if answer is None:
            raise McpFailure(f"{method}: the MCP server sent no answer")
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {"message": answer["error"]}
            raise McpFailure(f"{method}: {error.get('code')} {error.get('message')}")
        result = answer.get("result")
        if not isinstance(result, dict):
            raise McpFailure(f"{method}: the MCP server answered no result object")
        return result

    async def send(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Send one message; the answer to it (None for a notification)."""
        if self.is_http:
            return await asyncio.get_running_loop().run_in_executor(None, self._post, message)
        return await self._stdio(message)

    # -- stdio

    async def _spawn(self) -> None:
        command = self.server.get("command")
        if not command:
            raise McpFailure("the MCP server entry has no command")
        env = {**os.environ, **_pairs(self.server.get("env"))}
        try:
            self.process = await asyncio.create_subprocess_exec(
                str(command),
                *[str(a) for a in self.server.get("args") or []],
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,  # never the agent's own stdout: that is the ACP channel
                stderr=sys.stderr,
                env=env,
                limit=MCP_LINE_LIMIT,
            )
        except OSError as exc:
            raise McpFailure(f"cannot start the MCP server {command}: {exc}") from exc

    async def _stdio(self, message: dict[str, Any]) -> dict[str, Any] | None:
        process = self.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise McpFailure(f"the MCP server closed its input: {exc}") from exc
        if "id" not in message:
            return None
        while True:
            line = await process.stdout.readline()
            if not line:
                raise McpFailure(f"the MCP server exited (code {process.returncode}) before answering")
            try:
                incoming = json.loads(line)
            except ValueError:
                continue
            if not isinstance(incoming, dict):
                continue
            if "method" in incoming:  # a request or notification from the server
                if incoming.get("id") is not None:
                    refusal = {"code": -32601, "message": "not supported by this fake client"}
                    process.stdin.write(
                        json.dumps({"jsonrpc": "2.0", "id": incoming["id"], "error": refusal}).encode() + b"\n"
                    )
                continue
            if incoming.get("id") == message["id"]:
                return incoming

    # -- streamable HTTP

    def _headers(self) -> dict[str, str]:
        headers = {
            **_pairs(self.server.get("headers")),
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if self.negotiated:
            headers["MCP-Protocol-Version"] = self.protocol_version
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        return headers

    def _post(self, message: dict[str, Any]) -> dict[str, Any] | None:
        url = str(self.server.get("url") or "")
        data = json.dumps(message).encode()
        request = urllib.request.Request(url, data=data, headers=self._headers(), method="POST")
        try:
            with self._opener.open(request, timeout=MCP_TIMEOUT) as response:
                body = response.read()
                kind = response.headers.get("Content-Type", "")
                session_id = response.headers.get("Mcp-Session-Id")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            exc.close()
            raise McpFailure(f"HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise McpFailure(f"cannot reach the MCP server: {getattr(exc, 'reason', exc)}") from exc
        if session_id:
            self.session_id = session_id
        if "id" not in message or not body.strip():
            return None
        if kind.startswith("text/event-stream"):
            for line in body.decode("utf-8", "replace").splitlines():
                if line.startswith("data:"):
                    with contextlib.suppress(ValueError):
                        event = json.loads(line[5:].strip())
                        if isinstance(event, dict) and event.get("id") == message["id"]:
                            return event
            return None
        answer = json.loads(body)
        return answer if isinstance(answer, dict) else None

    def _delete(self) -> None:
        request = urllib.request.Request(str(self.server.get("url") or ""), headers=self._headers(), method="DELETE")
        with contextlib.suppress(urllib.error.URLError, OSError), self._opener.open(request, timeout=10.0):
            pass

    async def close(self) -> None:
        if self.is_http:
            if self.session_id:
                await asyncio.get_running_loop().run_in_executor(None, self._delete)
            return
        process = self.process
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()


def _announce_start(unknown_args: list[str]) -> None:
    """``FAKE_ACP_STARTED`` / ``FAKE_ACP_HOLD`` (see the module docstring)."""
    started = os.environ.get("FAKE_ACP_STARTED")
    if started:
        try:
            stdin_is_devnull = os.path.samestat(os.fstat(0), os.stat(os.devnull))
        except OSError:
            stdin_is_devnull = False
        with open(started, "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "stdinIsDevNull": stdin_is_devnull}) + "\n")
    hold = os.environ.get("FAKE_ACP_HOLD")
    if hold and "--version" in unknown_args:
        with open(hold, "rb") as fifo:
            fifo.read()


def _with_session_delete(agent: FakeAgent) -> None:
    """Route ``session/delete`` to ``agent.delete_session``: the SDK's agent router does not."""
    from acp.agent import connection
    from acp.router import Route

    build = connection.build_agent_router

    def build_with_delete(target: Any, use_unstable_protocol: bool = False) -> Any:
        router = build(target, use_unstable_protocol=use_unstable_protocol)
        if target is agent:

            async def delete(params: Any) -> Any:
                session_id = params.get("sessionId") if isinstance(params, dict) else None
                if not isinstance(session_id, str):
                    raise RequestError.invalid_params({"sessionId": "required"})
                return await agent.delete_session(session_id)

            router.add_route(Route(method="session/delete", func=delete, kind="request"))
        return router

    connection.build_agent_router = build_with_delete  # type: ignore[assignment]


def _attempt(action: Any) -> str:
    try:
        return "ok:" + str(action())[:300]
    except Exception as exc:  # what the attempt met is the answer
        return f"error:{type(exc).__name__}:{exc}"[:300]


def run_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """``read`` paths, ``write`` {path: text}, ``listdir`` paths, ``connect`` [host, port] pairs,
    ``http`` [url, {headers}] pairs, ``env`` names, ``whoami``, ``pids`` (what /proc shows)."""
    import socket
    import urllib.request

    out: dict[str, Any] = {}
    for path in spec.get("read", []):
        out[f"read {path}"] = _attempt(lambda p=path: Path(p).read_text(encoding="utf-8", errors="replace"))
    for path, body in (spec.get("write") or {}).items():
        out[f"write {path}"] = _attempt(lambda p=path, b=body: Path(p).write_text(b, encoding="utf-8"))
    for path in spec.get("listdir", []):
        out[f"listdir {path}"] = _attempt(lambda p=path: sorted(os.listdir(p)))
    for host, port in spec.get("connect", []):
        out[f"connect {host}:{port}"] = _attempt(lambda h=host, p=port: socket.create_connection((h, p), 3).close())
    for url, headers in spec.get("http", []):

        def fetch(url: str = url, headers: dict[str, str] = headers) -> str:
            request = urllib.request.Request(url, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return f"{response.status} {response.read(300).decode('utf-8', 'replace')}"
            except urllib.error.HTTPError as exc:
                return f"{exc.code} {exc.read(300).decode('utf-8', 'replace')}"

        out[f"http {url}"] = _attempt(fetch)
    for name in spec.get("env", []):
        out[f"env {name}"] = os.environ.get(name)
    if spec.get("whoami"):
        out["uid"] = os.getuid()
        out["home"] = os.environ.get("HOME")
        out["cwd"] = os.getcwd()
    if spec.get("pids"):
        out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python contrib/fake_acp_agents/agent.py --behaviour NAME``."""
    parser = argparse.ArgumentParser(prog="python contrib/fake_acp_agents/agent.py", description=__doc__.split("\n")[0])
    parser.add_argument("--behaviour", "--behavior", choices=BEHAVIOURS, default="basic")
    parser.add_argument(
        "--delay", type=float, default=float(os.environ.get("FAKE_ACP_DELAY") or 0.0), help="seconds per chunk"
    )
    parser.add_argument("--state-dir", default=os.environ.get("FAKE_ACP_STATE_DIR") or None)
    parser.add_argument(
        "--mcp-http", action="store_true", help="declare mcpCapabilities.http (else stdio MCP servers only)"
    )
    parser.add_argument("--session-delete", action="store_true", help="declare and answer session/delete")
    args, unknown = parser.parse_known_args(argv)
    _announce_start(unknown)
    agent = FakeAgent(
        args.behaviour,
        delay=args.delay,
        state_dir=args.state_dir,
        mcp_http=args.mcp_http,
        session_delete=args.session_delete,
    )
    if args.session_delete:
        _with_session_delete(agent)
    asyncio.run(run_agent(cast(Agent, agent), use_unstable_protocol=True))


if __name__ == "__main__":
    main()
