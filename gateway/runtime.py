"""What a runtime plugin implements, and the per-run handle the core gives it."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from agent_gateway.journal import JournalFull
from agent_gateway.models import TERMINAL_KINDS, Run
from agent_gateway.server.fairness import WaitingRequests, waiting_requests, yield_slice
from agent_gateway.telemetry import NO_TRACE, RunTrace

if TYPE_CHECKING:
    from agent_gateway.files import AgentFiles
    from agent_gateway.sandbox import Sandbox
    from agent_gateway.tools import ToolFacade

# How earlier turns reach the agent: "agent_session" (the agent keeps them in its own session),
# "transcript_rebuild" (the runtime resends the gateway's transcript each turn) or "none" (each
# turn stands alone).
ContextCarrier = Literal["agent_session", "transcript_rebuild", "none"]


@dataclass
class RuntimePolicy:
    """What a runtime tells clients and the core about itself (``GET /v1/agents`` shows it as
    ``policy``). Plugin defaults; an agent's `initialize` answer may override them (see the
    `negotiate_runtime_policy` hook)."""

    # Shown to clients: whether the agent remembers earlier turns itself.
    context_carrier: ContextCarrier = "agent_session"
    # The agent can reopen a stored session after a restart (ACP `session/load`, or a runtime's
    # own session file): the ACP runtime tries it only when this is true.
    load_session: bool = False
    # The agent takes MCP servers over HTTP: the gateway offers its tools as an HTTP MCP server
    # instead of a stdio bridge process.
    mcp_http: bool = False
    # The runtime can forget a turn (the `rollback` multitask strategy): what the agent knows of
    # earlier turns is only what the gateway sends it each turn, so a turn left out is forgotten.
    # An agent that keeps its own session cannot.
    can_rollback: bool = False
    # The runtime takes tools the client defines and runs itself (OpenAI `tools`, AG-UI `tools`),
    # and a structured-output request (`response_format`): its model may answer with calls to
    # them. A protocol plugin passes them in the run's `options.clientTools` and returns the
    # calls (`client_tool.requested` events) to the client; for a runtime without it, the plugin
    # refuses such a request (400 `tools_not_supported`) or, configured so, ignores them.
    client_tools: bool = False
    # Anything else a plugin or a `negotiate_runtime_policy` hook wants clients to see.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "contextCarrier": self.context_carrier,
            "loadSession": self.load_session,
            "mcpHttp": self.mcp_http,
            "canRollback": self.can_rollback,
            "clientTools": self.client_tools,
            **self.extra,
        }


@dataclass
class TurnOutcome:
    """How a turn ended. The core turns it into the run's one terminal event."""

    status: Literal["completed", "failed", "cancelled"]
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


# How a run found its agent session (the receipt's `sessionMode`).
SessionMode = Literal["native_live", "loaded", "cold_resumed", "new_session"]


@dataclass
class SessionPlan:
    """What the session strategy decided for one run."""

    mode: SessionMode
    # Earlier turns to seed a new agent session with (bounded); empty for native_live/loaded.
    packet: list[dict[str, Any]] = field(default_factory=list)
    warning: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


Emit = Callable[..., Awaitable[Any]]


class McpServersFor(Protocol):
    """The gateway's MCP server entries for one turn's agent (``session/new`` ``mcpServers``)."""

    def __call__(self, turn: Turn, policy: RuntimePolicy, base_url: str | None = None) -> list[dict[str, Any]]: ...


@dataclass
class TurnServices:
    """What the gateway lends every turn, read through :class:`Turn`'s attributes (built once by
    the gateway; a runtime never builds one)."""

    data_dir: Path = Path(".")
    workspace_roots: Mapping[str, Path] = field(default_factory=dict)
    sandbox: Sandbox | None = None
    tools: ToolFacade | None = None
    files: AgentFiles | None = None
    # The gateway's own URL now (it may be learned after start-up), None while unknown.
    base_url: Callable[[], str | None] = lambda: None
    mcp_servers_for: McpServersFor | None = None
    # The `negotiate_runtime_policy` hook.
    negotiate_runtime_policy: Callable[[str, RuntimePolicy, dict[str, Any]], None] | None = None


NO_SERVICES = TurnServices()


class Turn:
    """One run as a runtime sees it. Created by the core; runtimes only read it and call
    `emit`, `set_session_mode`, `save_state`."""

    def __init__(
        self,
        run: Run,
        emit: Emit,
        history: list[dict[str, Any]],
        state: dict[str, Any],
        save_state: Callable[[dict[str, Any]], Awaitable[None]],
        on_session_mode: Callable[[str, dict[str, Any]], Awaitable[None]],
        services: TurnServices | None = None,
        plan: SessionPlan | None = None,
        ask_permission: Callable[[dict[str, Any], list[dict[str, Any]], float | None], Awaitable[str | None]]
        | None = None,
        update_receipt: Callable[..., Awaitable[None]] | None = None,
        emit_nowait: Callable[[str, dict[str, Any], str], Any] | None = None,
    ) -> None:
        self.run = run
        self._emit = emit
        # Appends without awaiting; raises JournalFull when the journal has no room (then `emit`).
        self._emit_nowait = emit_nowait
        self.history = history
        self.state = state
        self._save_state = save_state
        self.plan = plan or SessionPlan("new_session")
        self._on_session_mode = on_session_mode
        self._services = services or NO_SERVICES
        self._ask_permission = ask_permission
        self._update_receipt = update_receipt
        # Whatever the session strategy prepared for the runtime (e.g. a live agent binding).
        self.binding: Any = None
        self.cancel_requested = asyncio.Event()
        # A tracing plugin's handle on the run (the `trace_run` hook); does nothing without one.
        # A runtime calling a model wraps the call in `trace.model_call(...)`.
        self.trace: RunTrace = NO_TRACE
        self._text_parts: list[str] = []
        self.final_text: str | None = None
        # The loop's requests waiting for their answer: `emit` gives way to them (None without a
        # running loop, as in a test building a Turn).
        self._requests: WaitingRequests | None
        try:
            self._requests = waiting_requests()
        except RuntimeError:
            self._requests = None

    # -- what the gateway lends the turn --------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """The gateway's data directory (``[gateway] data_dir``)."""
        return self._services.data_dir

    @property
    def workspace_roots(self) -> Mapping[str, Path]:
        """Every configured workspace id to its folder (``[workspaces]``)."""
        return self._services.workspace_roots

    @property
    def workspace_root(self) -> Path | None:
        """The configured folder of this run's workspace; None when it has none."""
        root = self._services.workspace_roots.get(self.run.workspace_id)
        return Path(root) if root is not None else None

    @property
    def sandbox(self) -> Sandbox | None:
        """The gateway's sandbox (``[sandbox]``): how agent processes are confined."""
        return self._services.sandbox

    @property
    def tools(self) -> ToolFacade | None:
        """The gateway's tool facade (``call(name, arguments, scope)``, ``scope_for(run)``)."""
        return self._services.tools

    @property
    def files(self) -> AgentFiles | None:
        """Reads and writes of the run's workspace files on the agent's behalf (the tool facade's
        file tools, receipted): ``await turn.files.read_text(turn, path)``."""
        return self._services.files

    @property
    def base_url(self) -> str | None:
        """The gateway's own URL, where agents call back (its MCP server); None while unknown."""
        return self._services.base_url()

    def mcp_servers(self, policy: RuntimePolicy, base_url: str | None = None) -> list[dict[str, Any]]:
        """The gateway's own MCP server entries for this turn's agent (an HTTP entry when
        ``policy.mcp_http``, else a stdio bridge), each with a lease bound to the turn's agent
        binding; empty when the gateway has no tools or no URL. ``base_url``: where the agent
        reaches the gateway from inside its sandbox (default: :attr:`base_url`)."""
        provide = self._services.mcp_servers_for
        if provide is None:
            return []
        return provide(self, policy, base_url=base_url) if base_url else provide(self, policy)

    def negotiate_runtime_policy(self, agent_id: str, policy: RuntimePolicy, initialize_result: dict[str, Any]) -> None:
        """Let plugins adjust ``policy`` from the agent's ``initialize`` answer (the
        ``negotiate_runtime_policy`` hook)."""
        negotiate = self._services.negotiate_runtime_policy
        if negotiate is not None:
            negotiate(agent_id, policy, initialize_result)

    @property
    def services(self) -> dict[str, Any]:
        """Deprecated: the typed attributes above (``data_dir``, ``workspace_roots``, ``sandbox``,
        ``tools``, ``files``, ``base_url``, ``mcp_servers``)."""
        warnings.warn(
            "Turn.services is deprecated: use turn.data_dir, turn.workspace_roots, turn.sandbox, turn.tools, "
            "turn.files, turn.base_url and turn.mcp_servers(policy)",
            DeprecationWarning,
            stacklevel=2,
        )
        s = self._services
        return {
            "data_dir": s.data_dir,
            "workspace_roots": dict(s.workspace_roots),
            "sandbox": s.sandbox,
            "tools": s.tools,
            "files": s.files,
            "base_url": s.base_url(),
            "mcp_servers_for": s.mcp_servers_for,
        }

    @property
    def message(self) -> str:
        return str(self.run.request.get("message", ""))

    @property
    def context(self) -> dict[str, Any]:
        return dict(self.run.request.get("context") or {})

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.run.request.get("options") or {})

    async def emit(self, kind: str, payload: dict[str, Any], source: str | None = None) -> None:
        """Append an event to the run's journal. Terminal kinds are the core's to write."""
        if kind in TERMINAL_KINDS:
            raise ValueError(f"runtimes do not emit {kind}; return a TurnOutcome instead")
        if source != "adapter_replay":
            if kind == "message.delta":
                self._text_parts.append(str(payload.get("text", "")))
            elif kind == "message.completed" and "text" in payload:
                self.final_text = str(payload["text"])
        emit_nowait = self._emit_nowait
        if emit_nowait is not None:
            try:
                emit_nowait(kind, payload, source or self.run.agent_id)
            except JournalFull:
                pass  # storage is behind: wait for room
            else:
                # A runtime emitting in a tight loop (nothing else suspends it) holds the loop for
                # its whole slice: while a request that just arrived waits (a new run's stream
                # being attached), give way to it as `WorkSlices` runtimes do, so it is answered
                # in a few short loop turns instead of one slice of this run per turn.
                requests = self._requests
                if requests is not None and requests.holding():
                    await yield_slice()
                return
        await self._emit(kind, payload, source)

    def emit_nowait(self, kind: str, payload: dict[str, Any], source: str | None = None) -> bool:
        """`emit` without awaiting, for a runtime that handles many events in one go: appends and
        returns True when the journal has room; returns False, having appended nothing, when the
        caller must `await emit(...)` instead (storage is behind)."""
        emit_nowait = self._emit_nowait
        if emit_nowait is None or kind in TERMINAL_KINDS:
            return False
        try:
            emit_nowait(kind, payload, source or self.run.agent_id)
        except JournalFull:
            return False
        if source != "adapter_replay":
            if kind == "message.delta":
                text = payload.get("text", "")
                self._text_parts.append(text if type(text) is str else str(text))
            elif kind == "message.completed" and "text" in payload:
                self.final_text = str(payload["text"])
        return True

    @property
    def assistant_text(self) -> str:
        return self.final_text if self.final_text is not None else "".join(self._text_parts)

    async def set_session_mode(self, mode: str, detail: dict[str, Any] | None = None) -> None:
        """Record how this run found its agent session (on the receipt and as an event)."""
        await self._on_session_mode(mode, detail or {})

    async def request_permission(
        self, tool_call: dict[str, Any], options: list[dict[str, Any]], timeout: float | None = None
    ) -> str | None:
        """Ask the client; returns the chosen optionId, or None when cancelled or timed out.
        Emits `permission.requested` / `permission.resolved`; the run is `awaiting_permission`
        meanwhile."""
        if self._ask_permission is None:
            return None
        return await self._ask_permission(tool_call, options, timeout)

    async def set_provider_run_id(self, provider_run_id: str) -> None:
        """Record the agent's own id for this run (its session id) on the receipt."""
        if self._update_receipt is not None:
            await self._update_receipt(provider_run_id=provider_run_id)

    async def save_state(self, state: dict[str, Any]) -> None:
        """Persist the runtime's per-session state (e.g. the agent's session id)."""
        self.state = state
        await self._save_state(state)


class Runtime(Protocol):
    """An agent runtime. Optionally it carries its own session strategy as a ``session_strategy``
    attribute (an object with ``async plan(turn, runtime) -> SessionPlan``, see
    :class:`agent_gateway.sessions.SessionStrategy`): the core's default `session_strategy` hook
    uses it, so a plugin needs no hook implementation to pick the strategy of its own runtime."""

    agent_id: str
    display_name: str
    provider: str
    policy: RuntimePolicy

    def describe(self) -> dict[str, Any]:
        """Static descriptor parts: capabilities, fields, availability."""

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        """Run one turn: emit events, watch `turn.cancel_requested`, return how it ended.
        An exception ends the run `failed` with its message."""

    async def close(self) -> None:
        """Release processes and connections at shutdown."""
