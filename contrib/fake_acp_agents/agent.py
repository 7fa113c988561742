"""Fake ACP agents built on the official SDK (``agent-client-protocol``, import ``acp``).

Run as ``python -m contrib.fake_acp_agents --behaviour NAME``. Every behaviour
answers ``initialize``, ``session/new``, ``session/list``, ``session/resume``,
``session/close``, ``session/set_mode`` and ``session/set_config_option``; a
plain prompt is answered by streaming one thought chunk and then
``"echo: <prompt text>"`` in a few message chunks; the prompt ``history?``
answers with the previous prompts of the session joined by ``|``.
``session/cancel`` ends an in-flight prompt with ``stopReason: cancelled``.

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

``FAKE_ACP_DELAY`` (or ``--delay``) adds that many seconds before each message
chunk (cancellable), to make turns slow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from acp import (
    RequestError,
    run_agent,
    start_tool_call,
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
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
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
    "reject_concurrent",
    "permission",
    "crash",
    "flood",
    "weird",
    "stderr_flood",
    "fs",
)
BIG_CHUNK_BYTES = 5 * 1024 * 1024
STDERR_FLOOD_BYTES = 5 * 1024 * 1024
CRASH_EXIT_CODE = 3
MODELS: tuple[str, ...] = ("fake-small", "fake-large")


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

    def __init__(self, behaviour: str, *, delay: float = 0.0, state_dir: str | None = None) -> None:
        if behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown behaviour {behaviour!r}")
        self.behaviour = behaviour
        self.delay = delay
        self.state_dir = Path(state_dir) if state_dir else None
        self.sessions: dict[str, SessionState] = {}
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
                load_session=self.behaviour in ("replay", "silent_load"),
                prompt_capabilities=PromptCapabilities(image=False, audio=False, embedded_context=True),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                ),
            ),
            agent_info=Implementation(name=f"fake-acp-{self.behaviour}", title="Fake ACP agent", version="0.1"),
        )

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        state = SessionState(f"fake-{uuid.uuid4().hex[:12]}", cwd)
        self.sessions[state.session_id] = state
        self._persist(state)
        return NewSessionResponse(session_id=state.session_id, config_options=[self._model_option(state)])

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse | None:
        if self.behaviour not in ("replay", "silent_load"):
            raise RequestError.method_not_found("session/load")
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
        if self.behaviour == "reject_concurrent" and state.busy:
            raise RequestError(-32600, "a prompt is already running for this session")
        async with state.lock:
            state.busy = True
            state.cancel.clear()
            text = "".join(getattr(block, "text", "") for block in prompt)
            try:
                reply, stop = await self._turn(state, text)
            except Cancelled:
                reply, stop = "", "cancelled"
            finally:
                state.busy = False
            state.history.append({"user": text, "agent": reply})
            self._persist(state)
            return {"stopReason": stop}

    # ------------------------------------------------------------------ turns

    async def _turn(self, state: SessionState, text: str) -> tuple[str, str]:
        sid = state.session_id
        handler = getattr(self, f"_turn_{self.behaviour}", None)
        if handler is not None:
            result = await handler(state, text)
            if result is not None:
                return result
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


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m contrib.fake_acp_agents --behaviour NAME``."""
    parser = argparse.ArgumentParser(prog="python -m contrib.fake_acp_agents", description=__doc__.split("\n")[0])
    parser.add_argument("--behaviour", "--behavior", choices=BEHAVIOURS, default="basic")
    parser.add_argument(
        "--delay", type=float, default=float(os.environ.get("FAKE_ACP_DELAY") or 0.0), help="seconds per chunk"
    )
    parser.add_argument("--state-dir", default=os.environ.get("FAKE_ACP_STATE_DIR") or None)
    args = parser.parse_args(argv)
    agent = FakeAgent(args.behaviour, delay=args.delay, state_dir=args.state_dir)
    asyncio.run(run_agent(cast(Agent, agent), use_unstable_protocol=True))
