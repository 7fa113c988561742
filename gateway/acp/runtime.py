"""A runtime for any ACP agent over stdio, with live session bindings.

Plugins give an :class:`AcpAgentSpec` (command, environment, policy defaults); this module does
the rest the same way for every agent:

- **Bindings.** A live agent session is bound to (actor, gateway session, agent, profile, model,
  workspace, allowed-roots hash) and reused turn after turn (`native_live`). A finished or
  cancelled turn keeps it; a change of any key part closes it; idle bindings are evicted after
  `idle_seconds`; at most `max_processes` agent processes live at once, at most
  `max_processes_per_actor` of them one actor's; a turn that finds none free closes an idle
  binding by the fair-share rule of :mod:`agent_gateway.capacity` (never a busy one, never that
  of an actor within its share) or waits up to `process_wait_seconds` for one.
- **Session strategy.** Without a live binding: `session/load` of the stored agent session when
  the agent declares `loadSession`, believed only with replay evidence (`loaded`); otherwise a
  new session seeded with the bounded cold-resume packet (`cold_resumed`) or `new_session`.
- **Turns.** Updates are mapped (:func:`map_update`) and journalled in order; the prompt result
  ends the run; cancel sends `session/cancel` and keeps the binding; an agent that dies fails the
  run with its exit code and stderr tail, and the next turn starts a new process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_gateway.acp.client import (
    CANCELLED_PERMISSION,
    AcpError,
    AcpProcess,
    AcpProcessExited,
    AcpRemoteError,
    AcpRequestError,
    AcpTimeout,
)
from agent_gateway.acp.mapping import coalesce_updates, extract_text, map_update
from agent_gateway.agent_sessions import NotDeclared
from agent_gateway.capacity import ProcessCapacity, ProcessUse
from agent_gateway.environment import agent_environment
from agent_gateway.paths import allowed_roots_of
from agent_gateway.runtime import RuntimePolicy, SessionPlan, Turn, TurnOutcome
from agent_gateway.sandbox import (
    AgentLaunch,
    Sandbox,
    SandboxedCommand,
    parse_endpoint,
    program_paths,
    safe_name,
    unconfined,
)
from agent_gateway.sessions import (
    SHORT_REPLY_WARNING,
    cold_resume_packet,
    has_context,
    is_bare_short_reply,
    prompt_text,
)

log = logging.getLogger("agent_gateway.acp.runtime")

STANDARD_COMPLETIONS = {"end_turn", "max_tokens", "max_turn_requests"}
# Updates in one read of the agent's stdout from which its consecutive text deltas are journalled
# joined. Two: a second update in the same read waited in the pipe while the gateway handled the
# first, so the agent is ahead and its backlog is merged, as a lagging client's stream is, whatever
# its write pattern (an agent writing one line per write at about the gateway's pace leaves a few
# updates per read, rarely 32). A paced agent (one update, then a pause) is read one update at a
# time and gets one event per update.
COALESCE_BACKLOG = 2
# Deletes an agent session (offered when `initialize` declares sessionCapabilities.delete).
ACP_DELETE_METHOD = "session/delete"
ALLOW_KINDS = ("allow_once", "allow_always")


@dataclass
class AcpAgentSpec:
    """What a plugin says about its agent. Everything else is negotiated or generic."""

    agent_id: str
    display_name: str
    provider: str
    command: list[str]
    # Added to the agent's base environment (see :func:`agent_gateway.agent_environment`).
    env: dict[str, str] = field(default_factory=dict)
    # True: the agent gets the gateway's whole environment instead of the base one.
    inherit_env: bool = False
    # Where the agent process runs (its config files live there); None: the workspace root.
    process_dir: Path | None = None
    policy: RuntimePolicy = field(default_factory=RuntimePolicy)
    # Called with the agent's per-actor home before each process start (write config files, ...).
    prepare: Callable[[Path], None] | None = None
    # Run the process in the per-actor home (its config files live there) instead of `process_dir`
    # or the workspace.
    process_in_home: bool = False
    # Where the per-actor homes live (<homes_root>/<actor>); None: the gateway's
    # <data_dir>/agent-homes/<agent-id>/.
    homes_root: Path | None = None
    # Environment variables set to the per-actor home (besides HOME), e.g. ("HERMES_HOME",).
    home_env: tuple[str, ...] = ()
    # (host, port) endpoints the agent may reach from its sandbox (its model endpoint...).
    network: list[tuple[str, int]] = field(default_factory=list)
    # More paths the agent may read inside its sandbox (its install is found from `command`).
    read_only: list[Path] = field(default_factory=list)
    # Folders every actor's process of this agent may write besides its home and the run's allowed
    # roots (shared across actors: each one weakens the per-actor separation).
    writable: list[Path] = field(default_factory=list)
    # Replayed user messages starting with one of these are the agent's own context, not history.
    replay_ignore_prefixes: tuple[str, ...] = ()
    # Tool kinds (ACP tool_call.kind) whose permission requests are allowed without asking.
    auto_allow_kinds: tuple[str, ...] = ()
    permission_timeout: float = 300.0
    idle_seconds: float = 900.0
    max_processes: int = 4
    # Processes one actor may hold (0: all `max_processes`), and how long a turn waits for one.
    max_processes_per_actor: int = 2
    process_wait_seconds: float = 300.0
    # Seconds to wait for `initialize`, for `session/new` / `session/load`, for a prompt's result
    # (None: no limit), and for the agent to stop after `session/cancel` before it is closed.
    initialize_timeout: float = 60.0
    session_timeout: float = 120.0
    prompt_timeout: float | None = None
    cancel_grace: float = 10.0
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    # Updates in one read of the agent's stdout from which its consecutive text deltas are
    # journalled joined (see COALESCE_BACKLOG); 0: always one event per update.
    coalesce_backlog: int = COALESCE_BACKLOG
    version: str | None = None
    capabilities: list[str] = field(default_factory=lambda: ["chat", "files"])
    fields: list[dict[str, Any]] = field(default_factory=list)
    # What to do when the command is not found (the descriptor's availability reason), e.g.
    # "install it with `npm install -g reasonix` or set [reasonix] command".
    install_hint: str = ""


# Keys every ACP section shares: an ACP runtime plugin's section (which adds its own
# agent-specific keys) and each `[acp_agents.<agent-id>]` table.
SECTION_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "env": {},
    "inherit_env": False,
    "idle_seconds": 900.0,
    "max_processes": 4,
    # Half the default max_processes: a second actor always finds processes free. 0: no
    # per-actor limit (still, no actor closes another's binding while it is within its share).
    "max_processes_per_actor": 2,
    # A turn that finds no process free waits this long for one, then fails.
    "process_wait_seconds": 300.0,
    "permission_timeout_seconds": 300.0,
    "auto_allow_kinds": [],
    "mcp_servers": [],
    "initialize_timeout": 60.0,
    "session_timeout": 120.0,
    # 0: no limit (a prompt may run as long as the agent works; cancel still stops it).
    "prompt_timeout": 0.0,
    "cancel_grace": 10.0,
    # host:port endpoints the agent may reach from its sandbox besides its model endpoint (which a
    # runtime plugin adds itself) and the gateway's MCP surface.
    "network": [],
    # Paths the agent may read inside its sandbox besides its own install (found from `command`).
    "sandbox_read_only": [],
    # Folders the agent may write besides its per-actor home and the run's allowed roots; shared by
    # every actor, so each one weakens the separation between actors.
    "sandbox_writable": [],
}

_POSITIVE_KEYS = (
    "idle_seconds",
    "permission_timeout_seconds",
    "process_wait_seconds",
    "initialize_timeout",
    "session_timeout",
    "cancel_grace",
)


def validate_section(section: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems with the shared keys of an ACP section (types are checked before this)."""
    problems = []
    command = section.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(p, str) and p for p in command):
        problems.append(("command", "must be a non-empty list of strings"))
    if section["max_processes"] < 1:
        problems.append(("max_processes", "must be at least 1"))
    if section["max_processes_per_actor"] < 0:
        problems.append(("max_processes_per_actor", "must be 0 (no per-actor limit) or more"))
    for key in _POSITIVE_KEYS:
        if section[key] <= 0:
            problems.append((key, "must be positive"))
    if section["prompt_timeout"] < 0:
        problems.append(("prompt_timeout", "must be positive, or 0 for no limit"))
    for name, value in section["env"].items():
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            problems.append((f"env.{name}", "must be a string (or a number)"))
    if not all(isinstance(kind, str) for kind in section["auto_allow_kinds"]):
        problems.append(("auto_allow_kinds", "must be a list of ACP tool kinds (strings)"))
    for index, endpoint in enumerate(section["network"]):
        try:
            parse_endpoint(str(endpoint))
        except ValueError as exc:
            problems.append((f"network[{index}]", str(exc)))
    for key in ("sandbox_read_only", "sandbox_writable"):
        if not all(isinstance(p, str) and os.path.isabs(os.path.expanduser(p)) for p in section[key]):
            problems.append((key, "must be a list of absolute paths"))
    for index, server in enumerate(section["mcp_servers"]):
        if not isinstance(server, dict) or not isinstance(server.get("name"), str):
            problems.append((f"mcp_servers[{index}]", "must be a table with a `name` (ACP McpServer)"))
    return problems


def spec_options(section: dict[str, Any], default_model: str = "") -> dict[str, Any]:
    """The :class:`AcpAgentSpec` keywords that come straight from the shared section keys.
    ``default_model`` is the default of the agent's `model` field."""
    prompt_timeout = float(section["prompt_timeout"])
    return {
        "command": list(section["command"]),
        "inherit_env": bool(section["inherit_env"]),
        "auto_allow_kinds": tuple(section["auto_allow_kinds"]),
        "permission_timeout": float(section["permission_timeout_seconds"]),
        "idle_seconds": float(section["idle_seconds"]),
        "max_processes": int(section["max_processes"]),
        "max_processes_per_actor": int(section["max_processes_per_actor"]),
        "process_wait_seconds": float(section["process_wait_seconds"]),
        "mcp_servers": list(section["mcp_servers"]),
        "initialize_timeout": float(section["initialize_timeout"]),
        "session_timeout": float(section["session_timeout"]),
        "prompt_timeout": prompt_timeout if prompt_timeout > 0 else None,
        "cancel_grace": float(section["cancel_grace"]),
        "network": [parse_endpoint(str(e)) for e in section["network"]],
        "read_only": [Path(os.path.expanduser(p)) for p in section["sandbox_read_only"]],
        "writable": [Path(os.path.expanduser(p)) for p in section["sandbox_writable"]],
        "fields": [
            {"key": "model", "label": "Model", "kind": "string", "default": default_model},
            {"key": "profile", "label": "Profile", "kind": "string", "default": ""},
        ],
    }


@dataclass(frozen=True)
class BindingKey:
    actor_id: str
    session_id: str
    agent_id: str
    profile: str
    model: str
    workspace_id: str
    roots_hash: str

    @property
    def owner(self) -> tuple[str, str, str]:
        """One binding per (actor, gateway session, agent); the rest must match to reuse it."""
        return (self.actor_id, self.session_id, self.agent_id)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.__dict__, sort_keys=True).encode()).hexdigest()[:16]


class Binding:
    def __init__(self, key: BindingKey, process: AcpProcess, cwd: str) -> None:
        self.key = key
        self.process = process
        self.cwd = cwd
        self.agent_session_id: str | None = None
        self.turn: Turn | None = None
        self.replay: list[dict[str, Any]] | None = None
        self.busy = False
        self.last_used = time.monotonic()
        self.evict_handle: asyncio.TimerHandle | None = None
        self.config_options: list[dict[str, Any]] = []
        # The gateway URL the agent calls its MCP surface on from inside its sandbox (None: the gateway's).
        self.mcp_base_url: str | None = None
        self.confinement = ""
        self.confined = False

    @property
    def alive(self) -> bool:
        return not self.process.closed and self.process.returncode is None


def roots_hash(roots: list[str]) -> str:
    return hashlib.sha256(json.dumps(sorted(roots)).encode()).hexdigest()[:16]


def binary_available(command: list[str], search_path: str | None = None) -> tuple[bool, str | None]:
    """Whether the command's program exists, looked up on ``search_path`` (default: ``$PATH``)
    like the process start does with the agent's own PATH."""
    if not command:
        return False, None
    found = (
        shutil.which(command[0], path=search_path)
        if os.sep not in command[0]
        else (command[0] if os.access(command[0], os.X_OK) else None)
    )
    return found is not None, found


def prompt_usage(prompt: asyncio.Future[dict[str, Any]]) -> dict[str, int]:
    """The token counts of a `session/prompt` result's `usage` (ACP: `inputTokens`,
    `outputTokens`, `totalTokens`, `thoughtTokens`, `cachedReadTokens`, `cachedWriteTokens` for
    the turn), or {} when the agent sent none."""
    if not prompt.done() or prompt.cancelled() or prompt.exception() is not None:
        return {}
    result = prompt.result()
    usage = result.get("usage") if isinstance(result, dict) else None
    if not isinstance(usage, dict):
        return {}
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def missing_binary_reason(spec: AcpAgentSpec, search_path: str | None) -> str:
    """Why the agent cannot start, and what to do about it (the descriptor's availability reason)."""
    program = spec.command[0] if spec.command else "?"
    if os.sep in program:
        where = "is not an executable file"
    else:
        shown = search_path if search_path is not None else os.environ.get("PATH", "")
        where = f"not found on the agent's PATH ({shown[:300]}{'…' if len(shown) > 300 else ''})"
    hint = spec.install_hint or "install it, or give its full path as the first word of the agent's `command`"
    return f"{program} {where}: {hint}"


# First words of a command that are not the agent itself: `<word> --version` would report the
# interpreter or launcher ("Python 3.11.7"), so such commands are never probed.
NOT_THE_AGENT = re.compile(
    r"^(python[\d.]*|pypy[\d.]*|node(js)?|deno|bun|bunx|sh|bash|dash|zsh|env|uv|uvx|npx|npm|pnpm|yarn|pipx|"
    r"java|ruby|perl|php)(\.exe)?$"
)
# Seconds a version probe may take before it is killed (read at call time: tests may raise it).
PROBE_TIMEOUT = 3.0


def probe_version(command: list[str], timeout: float | None = None, env: dict[str, str] | None = None) -> str | None:
    """`<binary> --version`, first line of its output; None if that has no digit, or the binary
    fails or does not answer within ``timeout`` (default :data:`PROBE_TIMEOUT`). Runs with stdin closed (an agent
    that ignores `--version` and waits for ACP on stdin gets end-of-file at once) in its own
    process group, killed whole on timeout. ``env``: the process's whole environment (default:
    the base agent environment). Blocking: call it off the event loop."""
    import subprocess

    env = agent_environment() if env is None else env
    available, path = binary_available(command, env.get("PATH"))
    if not available or path is None:
        return None
    try:
        process = subprocess.Popen(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        stdout, stderr = process.communicate(timeout=PROBE_TIMEOUT if timeout is None else timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=1.0)
        return None
    finally:
        with contextlib.suppress(OSError):  # a child of the binary that outlived it
            os.killpg(process.pid, signal.SIGKILL)
    if process.returncode != 0:
        return None
    lines = (stdout or stderr or "").strip().splitlines()
    first = lines[0].strip()[:200] if lines else ""
    # A version has a digit; anything else is the agent saying something else (a log line, a usage).
    return first if re.search(r"\d", first) else None


def probes_itself(command: list[str]) -> bool:
    """Whether `<first word> --version` asks the agent, not an interpreter or launcher."""
    return bool(command) and not NOT_THE_AGENT.match(os.path.basename(command[0]).lower())


class VersionProbes:
    """Version probes run in a background thread, at most once per binary (the result, even
    None, is kept for the process's lifetime): a descriptor never waits on an agent process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[str, str | None] = {}
        self._started: set[str] = set()

    def version(self, binary: str, command: list[str], env: dict[str, str]) -> tuple[bool, str | None]:
        """(probed, version): the answer when the probe has ended; else starts it (once)."""
        with self._lock:
            if binary in self._results:
                return True, self._results[binary]
            if binary in self._started:
                return False, None
            self._started.add(binary)
        thread = threading.Thread(
            target=self._run, args=(binary, [binary, *command[1:]], env), name="agent-version-probe", daemon=True
        )
        thread.start()
        return False, None

    def _run(self, binary: str, command: list[str], env: dict[str, str]) -> None:
        try:
            version = probe_version(command, env=env)
        except Exception:  # a probe must never take anything down
            log.exception("version probe of %s failed", binary)
            version = None
        with self._lock:
            self._results[binary] = version


VERSION_PROBES = VersionProbes()


class AcpRuntime:
    """A :class:`agent_gateway.runtime.Runtime` for one ACP agent."""

    def __init__(self, spec: AcpAgentSpec) -> None:
        self.spec = spec
        self.agent_id = spec.agent_id
        self.display_name = spec.display_name
        self.provider = spec.provider
        self.policy = spec.policy
        # The core's default `session_strategy` uses this: live binding, then load, then cold resume.
        self.session_strategy = AcpSessionStrategy()
        self._bindings: dict[tuple[str, str, str], Binding] = {}
        self._start_lock = asyncio.Lock()
        self.capacity = ProcessCapacity(
            spec.agent_id, spec.max_processes, spec.max_processes_per_actor, spec.process_wait_seconds
        )
        self.initialize_result: dict[str, Any] | None = None
        # The agent's `initialize` `agentInfo` ({name, title, version}) once a process has started.
        self.agent_info: dict[str, Any] | None = None

    # -- descriptor ---------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        environment = self._environment()
        available, path = binary_available(self.spec.command, environment.get("PATH"))
        version, version_source = self._version(available, path, environment)
        availability: dict[str, Any] = {
            "available": available,
            "binaryFound": available,
            "binary": path,
            "command": self.spec.command[:1],
            "version": version,
            "versionSource": version_source,
            "reason": None if available else missing_binary_reason(self.spec, environment.get("PATH")),
        }
        if self.agent_info:
            availability["agentInfo"] = dict(self.agent_info)
        return {
            "capabilities": list(self.spec.capabilities),
            "availability": availability,
            "fields": list(self.spec.fields),
            "toolAccess": True,
            "liveBindings": len(self._bindings),
        }

    def _version(self, available: bool, path: str | None, environment: dict[str, str]) -> tuple[str | None, str | None]:
        """(version, where it came from): the agent's own `initialize` answer (`agentInfo`), else
        the plugin's, else a background `--version` probe of the agent binary (never of an
        interpreter; never waited for: None until it has answered)."""
        if self.agent_info and self.agent_info.get("version"):
            return str(self.agent_info["version"]), "initialize"
        if self.spec.version is not None:
            return self.spec.version, "plugin"
        if not available or path is None or not probes_itself(self.spec.command):
            return None, None
        probed, version = VERSION_PROBES.version(path, self.spec.command, environment)
        return (version, "probe") if probed and version else (None, None)

    def live_bindings(self) -> int:
        return sum(1 for b in self._bindings.values() if b.alive)

    # -- processes ----------------------------------------------------------------------------
    def _workspace_dir(self, turn: Turn) -> Path | None:
        """The configured folder of the run's workspace; None when it has none."""
        return turn.workspace_root

    def home_for(self, turn: Turn) -> Path:
        """The agent's own home for the run's actor (sessions, memory, config never cross actors)."""
        if self.spec.homes_root is not None:
            return self.spec.homes_root / safe_name(turn.run.actor_id)
        sandbox = turn.sandbox
        if sandbox is not None:
            return sandbox.home_for(self.agent_id, turn.run.actor_id)
        return turn.data_dir / "agent-homes" / safe_name(self.agent_id) / safe_name(turn.run.actor_id)

    def _launch(self, turn: Turn) -> AgentLaunch:
        """What the process for this turn's binding needs: see :class:`agent_gateway.AgentLaunch`."""
        home = self.home_for(turn)
        workspace_root = self._workspace_dir(turn)
        # A run without a workspace folder gets an empty one of the agent's own, never the gateway's.
        workspace_dir = workspace_root if workspace_root is not None else home / "no-workspace"
        writable: list[tuple[Path, Path]] = []
        if workspace_root is not None:
            roots = [r for r in turn.context.get("allowedRoots") or [] if isinstance(r, str)]
            for root in allowed_roots_of(workspace_root, roots):
                if root.absolute is not None:
                    writable.append((root.absolute, workspace_dir / root.label.rstrip("/")))
        if self.spec.process_in_home:
            cwd = home
        elif self.spec.process_dir is not None:
            cwd = self.spec.process_dir
            writable.append((cwd, cwd))
        else:
            cwd = workspace_dir
        for extra in self.spec.writable:
            writable.append((extra, extra))
        env = self._environment()
        env["HOME"] = str(home)
        for name in self.spec.home_env:
            env[name] = str(home)
        data_dir = turn.data_dir
        read_only = program_paths(self.spec.command, env.get("PATH"), [str(data_dir)])
        base_url = turn.base_url
        return AgentLaunch(
            agent_id=self.agent_id,
            actor_id=turn.run.actor_id,
            workspace_id=turn.run.workspace_id,
            command=list(self.spec.command),
            env=env,
            cwd=cwd,
            home=home,
            workspace_dir=workspace_dir,
            writable=writable,
            read_only=[*read_only, *self.spec.read_only],
            network=list(self.spec.network),
            mcp_url=str(base_url) if base_url else None,
        )

    def sandbox_preview(self, data_dir: Path) -> AgentLaunch:
        """The launch of a process for an actor ``<actor>`` with no workspace (``agent-gateway
        doctor`` shows how it would be confined)."""
        homes = self.spec.homes_root or data_dir / "agent-homes" / safe_name(self.agent_id)
        home = homes / "<actor>"
        env = self._environment()
        return AgentLaunch(
            agent_id=self.agent_id,
            actor_id="<actor>",
            workspace_id="<workspace>",
            command=list(self.spec.command),
            env=env,
            cwd=home,
            home=home,
            workspace_dir=home / "no-workspace",
            writable=[(p, p) for p in self.spec.writable],
            read_only=[*program_paths(self.spec.command, env.get("PATH"), [str(data_dir)]), *self.spec.read_only],
            network=list(self.spec.network),
        )

    async def _confine(self, turn: Turn, launch: AgentLaunch) -> SandboxedCommand:
        sandbox = turn.sandbox
        await asyncio.to_thread(self._prepare_dirs, launch, sandbox)
        if sandbox is None:
            return unconfined(launch, "none: no sandbox service")
        return await sandbox.confine(launch)

    def _prepare_dirs(self, launch: AgentLaunch, sandbox: Sandbox | None) -> None:
        for extra in self.spec.writable:
            if not extra.exists():
                extra.mkdir(parents=True)
                if sandbox is not None:
                    sandbox.prepare_home(extra)  # made here: the agent's user owns it
        launch.home.mkdir(parents=True, exist_ok=True)
        launch.workspace_dir.mkdir(parents=True, exist_ok=True)
        launch.cwd.mkdir(parents=True, exist_ok=True)
        if self.spec.prepare is not None:
            self.spec.prepare(launch.home)
        if sandbox is not None:
            sandbox.prepare_home(launch.home)

    async def _spawn(self, key: BindingKey, turn: Turn) -> Binding:
        await self._make_room(key.actor_id, turn)
        launch = self._launch(turn)
        command = await self._confine(turn, launch)
        binding_box: dict[str, Binding] = {}
        process = AcpProcess(
            command.argv,
            env=command.env,
            cwd=command.cwd,
            on_updates=lambda updates: self._on_updates(binding_box["b"], updates),
            on_permission=lambda params: self._on_permission(binding_box["b"], params),
            on_read_text_file=lambda params: self._on_read(binding_box["b"], params),
            on_write_text_file=lambda params: self._on_write(binding_box["b"], params),
            name=self.agent_id,
        )
        binding = Binding(key, process, str(launch.workspace_dir))
        binding.mcp_base_url = command.mcp_base_url
        binding.confinement = command.confinement
        binding.confined = command.confined
        binding_box["b"] = binding
        try:
            await process.start()
            if command.cleanup is not None:
                command.clean_up_after(process.wait_closed)
            result = await process.initialize(timeout=self.spec.initialize_timeout)
        except BaseException:
            await process.close()
            if command.cleanup is not None and process.pid is None:
                await command.cleanup()
            raise
        self.initialize_result = result
        self._negotiate_policy(result, turn)
        return binding

    def _environment(self) -> dict[str, str]:
        """The agent process's whole environment: the base one (or the gateway's with
        `inherit_env`), then the spec's `env`."""
        return agent_environment(self.spec.env, inherit=self.spec.inherit_env)

    def _negotiate_policy(self, result: dict[str, Any], turn: Turn) -> None:
        """The plugin's defaults, overridden by what the agent declares, then by the hook."""
        caps = result.get("agentCapabilities") or {}
        mcp = caps.get("mcpCapabilities") or {}
        policy = self.policy
        policy.load_session = bool(caps.get("loadSession", False))
        policy.mcp_http = bool(mcp.get("http", False))
        agent_info = result.get("agentInfo")
        if isinstance(agent_info, dict):
            self.agent_info = {k: agent_info[k] for k in ("name", "title", "version") if agent_info.get(k) is not None}
        policy.extra["negotiated"] = True
        turn.negotiate_runtime_policy(self.agent_id, policy, result)

    async def _make_room(self, actor_id: str, turn: Turn | None = None) -> None:
        """Called with `_start_lock` held (let go while waiting): room for one more process of
        `actor_id`, by the fair-share rule (see :mod:`agent_gateway.capacity`)."""

        async def waiting(message: str) -> None:
            if turn is not None:
                wait = self.spec.process_wait_seconds
                await turn.emit("run.waiting", {"reason": "agent_capacity", "message": message, "waitSeconds": wait})

        await self.capacity.make_room(
            actor_id, self._process_uses, self._close_binding, lock=self._start_lock, on_wait=waiting
        )

    def _process_uses(self) -> list[ProcessUse]:
        return [ProcessUse(b.key.actor_id, b.busy, b.last_used, b) for b in self._bindings.values() if b.alive]

    async def _close_binding(self, binding: Binding, why: str) -> None:
        if self._bindings.get(binding.key.owner) is binding:
            del self._bindings[binding.key.owner]
        if binding.evict_handle is not None:
            binding.evict_handle.cancel()
        log.info("closing %s binding %s: %s", self.agent_id, binding.agent_session_id, why)
        try:
            await binding.process.close()
        finally:
            self.capacity.changed()

    def _schedule_eviction(self, binding: Binding) -> None:
        if binding.evict_handle is not None:
            binding.evict_handle.cancel()
        loop = asyncio.get_running_loop()

        def evict() -> None:
            if not binding.busy and self._bindings.get(binding.key.owner) is binding:
                task = loop.create_task(self._close_binding(binding, f"idle for {self.spec.idle_seconds:g} s"))
                task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

        binding.evict_handle = loop.call_later(self.spec.idle_seconds, evict)

    # -- session strategy ---------------------------------------------------------------------
    def binding_key(self, turn: Turn) -> BindingKey:
        options = turn.options
        return BindingKey(
            actor_id=turn.run.actor_id,
            session_id=turn.run.session_id,
            agent_id=self.agent_id,
            profile=str(options.get("profile") or ""),
            model=str(options.get("model") or ""),
            workspace_id=turn.run.workspace_id,
            roots_hash=roots_hash(list(turn.context.get("allowedRoots") or [])),
        )

    async def bind(self, turn: Turn) -> SessionPlan:
        """Find the agent session for this turn; the returned plan says how."""
        key = self.binding_key(turn)
        async with self._start_lock:
            binding = self._bindings.get(key.owner)
            if binding is not None and (binding.key != key or not binding.alive):
                why = "its agent process died" if not binding.alive else "workspace, roots, model or profile changed"
                await self._close_binding(binding, why)
                binding = None
            if binding is not None:
                binding.busy = True
                turn.binding = binding
                return SessionPlan("native_live", detail={"agentSessionId": binding.agent_session_id})
            binding = await self._spawn(key, turn)
            binding.busy = True
            self._bindings[key.owner] = binding
        turn.binding = binding
        try:
            return await self._attach_session(binding, turn, key)
        except BaseException:
            # turn.binding: the load may have replaced the process the binding started with.
            await self._close_binding(turn.binding, "could not open an agent session")
            raise

    async def _respawn(self, key: BindingKey, turn: Turn) -> Binding:
        """A new process for this binding key (the old one is closed), bound to the turn."""
        async with self._start_lock:
            binding = await self._spawn(key, turn)
            binding.busy = True
            self._bindings[key.owner] = binding
        turn.binding = binding
        return binding

    async def _forget_agent_session(self, turn: Turn) -> None:
        """Drop the stored agent session id, so no later turn tries it again."""
        if "agentSessionId" in turn.state or "bindingKey" in turn.state:
            await turn.save_state({k: v for k, v in turn.state.items() if k not in ("agentSessionId", "bindingKey")})

    async def _attach_session(self, binding: Binding, turn: Turn, key: BindingKey) -> SessionPlan:
        stored = turn.state.get("agentSessionId")
        same_key = turn.state.get("bindingKey") == key.digest()
        load_attempted = bool(stored and same_key and self.policy.load_session)
        fallback: dict[str, str] | None = None
        if load_attempted:
            replay, fallback = await self._try_load(binding, turn, str(stored))
            if replay is not None:
                binding.agent_session_id = str(stored)
                summary = await self._journal_replay(turn, replay)
                return SessionPlan("loaded", detail={"agentSessionId": stored, "replay": summary})
            assert fallback is not None
            log.warning(
                "%s: session/load of %s failed (%s): a new agent session takes over",
                self.agent_id,
                stored,
                fallback["message"],
            )
            # Whatever comes next, this load is never tried again ...
            await self._forget_agent_session(turn)
            # ... and a process that died or hung in it is replaced before the new session.
            if fallback["reason"] in ("exited", "timeout") or not binding.alive:
                await self._close_binding(binding, fallback["message"])
                binding = await self._respawn(key, turn)
        return await self._new_agent_session(binding, turn, key, stored, load_attempted, fallback)

    async def _new_agent_session(
        self,
        binding: Binding,
        turn: Turn,
        key: BindingKey,
        previous: Any,
        load_attempted: bool,
        fallback: dict[str, str] | None,
    ) -> SessionPlan:
        """`session/new` on the binding's process, seeded with the cold-resume packet when the
        gateway session has earlier turns. ``fallback``: why an earlier agent session was dropped."""
        raw = await binding.process.new_session_raw(
            binding.cwd, self._mcp_servers(turn), timeout=self.spec.session_timeout
        )
        binding.agent_session_id = str(raw["sessionId"])
        binding.config_options = list(raw.get("configOptions") or [])
        await self._apply_model(binding, key)
        await turn.save_state({"agentSessionId": binding.agent_session_id, "bindingKey": key.digest()})
        packet = cold_resume_packet(turn.history)
        detail: dict[str, Any] = {"agentSessionId": binding.agent_session_id}
        if previous:
            detail["previousAgentSessionId"] = previous
            detail["loadAttempted"] = load_attempted
        if fallback is not None:
            detail["fallback"] = fallback
        if packet:
            return SessionPlan("cold_resumed", packet, detail=detail)
        warning = SHORT_REPLY_WARNING if is_bare_short_reply(turn.message) and not has_context(turn.context) else None
        return SessionPlan("new_session", [], warning, detail)

    async def _try_load(
        self, binding: Binding, turn: Turn, session_id: str
    ) -> tuple[list[dict[str, Any]] | None, dict[str, str] | None]:
        """`session/load`: (the replayed updates, None), or (None, why it is not believed:
        ``{"reason": "error" | "exited" | "timeout" | "no_replay", "message"}``)."""
        binding.replay = []
        try:
            await binding.process.load_session(
                session_id, binding.cwd, self._mcp_servers(turn), timeout=self.spec.session_timeout
            )
        except AcpRemoteError as exc:
            return None, {"reason": "error", "message": f"session/load answered error {exc.code}: {exc.message}"}
        except AcpProcessExited as exc:
            code = _exit_code(exc, binding.confined)
            return None, {"reason": "exited", "message": f"the agent process {_exit_text(code)} during session/load"}
        except AcpTimeout:
            timeout = self.spec.session_timeout
            return None, {"reason": "timeout", "message": f"session/load got no answer within {timeout:g} s"}
        finally:
            replay, binding.replay = binding.replay, None
        if not any(u.get("sessionUpdate") in ("user_message_chunk", "agent_message_chunk") for u in replay):
            why = "session/load replayed no conversation: no evidence the agent still has the session"
            return None, {"reason": "no_replay", "message": why}
        return replay, None

    async def _journal_replay(self, turn: Turn, replay: list[dict[str, Any]]) -> dict[str, int]:
        """Journal replayed messages the gateway does not already hold, as `adapter_replay`."""
        messages: list[tuple[str, str]] = []
        for update in replay:
            kind = update.get("sessionUpdate")
            role = {"user_message_chunk": "user", "agent_message_chunk": "assistant"}.get(str(kind))
            if role is None:
                continue
            text = extract_text(update.get("content"))
            # Consecutive chunks of one role are one message, except around the agent's own context
            # (an agent may replay its own context snapshot and the first user message as two user
            # chunks in a row: merged, the user message was ignored along with the snapshot).
            if (
                messages
                and messages[-1][0] == role
                and not self._ignored(role, text)
                and not self._ignored(*messages[-1])
            ):
                messages[-1] = (role, messages[-1][1] + text)
            else:
                messages.append((role, text))
        known = {t.get("user", "").strip() for t in turn.history} | {
            t.get("assistant", "").strip() for t in turn.history
        }
        journalled = deduplicated = ignored = 0
        for role, text in messages:
            if self._ignored(role, text):
                ignored += 1
            elif text.strip() in known:
                deduplicated += 1
            else:
                journalled += 1
                await turn.emit("replay.message", {"role": role, "text": text}, source="adapter_replay")
        summary = {
            "messages": len(messages),
            "deduplicated": deduplicated,
            "journalled": journalled,
            "ignored": ignored,
            "updates": len(replay),
        }
        await turn.emit("session.replayed", summary, source="adapter_replay")
        return summary

    def _ignored(self, role: str, text: str) -> bool:
        """A replayed user message that is the agent's own context, not conversation history."""
        return (
            role == "user"
            and bool(self.spec.replay_ignore_prefixes)
            and text.lstrip().startswith(self.spec.replay_ignore_prefixes)
        )

    async def _apply_model(self, binding: Binding, key: BindingKey) -> None:
        if not key.model:
            return
        if any(o.get("id") == "model" for o in binding.config_options):
            await binding.process.set_config_option(binding.agent_session_id or "", "model", key.model)

    def _mcp_servers(self, turn: Turn) -> list[dict[str, Any]]:
        servers = list(self.spec.mcp_servers)
        servers.extend(turn.mcp_servers(self.policy, base_url=getattr(turn.binding, "mcp_base_url", None)))
        return servers

    # -- turns ----------------------------------------------------------------------------------
    async def run_turn(self, turn: Turn) -> TurnOutcome:
        outcome = await self._prompt_turn(turn)
        if self._session_forgotten(turn, outcome):
            await self._reopen_session(turn)
            outcome = await self._prompt_turn(turn)
        if outcome.status == "completed" or turn.assistant_text:
            await turn.emit("message.completed", {"text": turn.assistant_text})
        return outcome

    def _session_forgotten(self, turn: Turn, outcome: TurnOutcome) -> bool:
        """A `refusal` with no output on an agent session the gateway reused (live or loaded):
        the agent no longer knows it (an agent answers so for a session it forgot)."""
        return (
            outcome.detail.get("stopReason") == "refusal"
            and turn.plan.mode in ("native_live", "loaded")
            and not turn.assistant_text
            and not turn.cancel_requested.is_set()
        )

    async def _reopen_session(self, turn: Turn) -> None:
        """Drop the binding whose session the agent refused, forget the session id and give the
        turn a new agent session on a new process (with the cold-resume packet), saying why."""
        binding: Binding = turn.binding
        previous = binding.agent_session_id
        fallback = {
            "reason": "refusal",
            "message": f"the agent refused the prompt on its session {previous} (stopReason refusal)",
        }
        log.warning("%s: %s: a new agent session takes over", self.agent_id, fallback["message"])
        await self._close_binding(binding, fallback["message"])
        await self._forget_agent_session(turn)
        key = self.binding_key(turn)
        binding = await self._respawn(key, turn)
        try:
            plan = await self._new_agent_session(binding, turn, key, previous, False, fallback)
        except BaseException:
            await self._close_binding(binding, "could not open an agent session")
            raise
        turn.plan = plan
        await turn.set_session_mode(plan.mode, plan.detail)
        if plan.warning:
            await turn.emit("context.warning", {"message": plan.warning})

    async def _prompt_turn(self, turn: Turn) -> TurnOutcome:
        """One prompt on the turn's agent session (bound first when no strategy did)."""
        binding: Binding | None = turn.binding
        if binding is None:  # no strategy ran (a plugin replaced it): bind now
            plan = await self.bind(turn)
            turn.plan = plan
            await turn.set_session_mode(plan.mode, plan.detail)
            binding = turn.binding
        assert binding is not None and binding.agent_session_id is not None
        await turn.set_provider_run_id(binding.agent_session_id)
        binding.turn = turn
        binding.busy = True
        session_id = binding.agent_session_id
        # A traced run's context goes to the agent (ACP reserves `_meta.traceparent` for it).
        meta = {"traceparent": turn.trace.traceparent} if turn.trace.traceparent else None
        prompt = asyncio.ensure_future(
            binding.process.prompt(session_id, self.prompt_blocks(turn), timeout=self.spec.prompt_timeout, meta=meta)
        )
        cancel = asyncio.ensure_future(turn.cancel_requested.wait())
        try:
            done, _ = await asyncio.wait({prompt, cancel}, return_when=asyncio.FIRST_COMPLETED)
            if prompt not in done:
                await binding.process.cancel(session_id)
                try:
                    async with asyncio.timeout(self.spec.cancel_grace):
                        await asyncio.shield(prompt)
                except TimeoutError:
                    prompt.cancel()
                    await self._close_binding(binding, f"did not stop within {self.spec.cancel_grace:g} s of cancel")
                    return TurnOutcome("cancelled", "cancelled; the agent did not stop in time and was closed")
                except AcpError:
                    pass
            outcome = self._outcome(prompt, turn)
        finally:
            cancel.cancel()
            binding.turn = None
            binding.busy = False
            binding.last_used = time.monotonic()
            self.capacity.changed()  # an idle binding may make room for a waiting turn
        usage = prompt_usage(prompt)
        if usage:
            await turn.emit("usage.updated", usage)
        error = prompt.exception() if prompt.done() and not prompt.cancelled() else None
        if isinstance(error, AcpProcessExited):
            await self._close_binding(binding, "agent process exited")
        elif isinstance(error, AcpRemoteError | AcpTimeout):
            # The agent refused the prompt with an error (e.g. it no longer knows the session) or
            # never answered it: reusing this binding would fail the same way turn after turn, so
            # the next turn starts afresh (load with replay evidence, or cold resume).
            await self._close_binding(binding, f"the prompt failed: {error}")
        elif binding.alive:
            self._schedule_eviction(binding)
        return outcome

    def _outcome(self, prompt: asyncio.Future[dict[str, Any]], turn: Turn) -> TurnOutcome:
        error = prompt.exception() if not prompt.cancelled() else None
        if isinstance(error, AcpProcessExited):
            tail = (error.stderr_tail or "").strip()[-2000:]
            code = _exit_code(error, bool(turn.binding is not None and getattr(turn.binding, "confined", False)))
            return TurnOutcome(
                "failed",
                f"the agent process {_exit_text(code)}" + (f"; stderr: {tail}" if tail else ""),
                {"exitCode": code},
            )
        if isinstance(error, AcpRemoteError):
            return TurnOutcome(
                "failed",
                f"the agent answered error {error.code}: {error.message}",
                {"agentError": {"code": error.code, "message": error.message, "data": error.data}},
            )
        if isinstance(error, AcpTimeout):
            return TurnOutcome("failed", str(error))
        if error is not None:
            return TurnOutcome("failed", f"{type(error).__name__}: {error}")
        if prompt.cancelled():
            return TurnOutcome("cancelled", "cancelled")
        result = prompt.result() or {}
        stop = str(result.get("stopReason"))
        detail = {"stopReason": stop}
        if stop == "cancelled" or (turn.cancel_requested.is_set() and stop in STANDARD_COMPLETIONS):
            return TurnOutcome("cancelled", "cancelled by the client", detail)
        if stop in STANDARD_COMPLETIONS:
            return TurnOutcome("completed", None, detail)
        if stop == "refusal":
            return TurnOutcome("failed", "the agent refused the prompt (stopReason refusal)", detail)
        return TurnOutcome("failed", f"the agent ended the turn with an unknown stopReason {stop!r}", detail)

    def prompt_blocks(self, turn: Turn) -> list[dict[str, Any]]:
        return [{"type": "text", "text": prompt_text(turn)}]

    # -- agent → client ------------------------------------------------------------------------
    def _on_updates(self, binding: Binding, updates: list[tuple[str, Any]]) -> Awaitable[None] | None:
        """Journal the updates that arrived in one read, in order, one event per update — or, for
        a backlog of the spec's `coalesce_backlog` or more, with consecutive text deltas joined
        (`coalesce_updates`). Synchronously while the journal has room (the ACP reader then goes
        on at once); otherwise the awaitable that journals the rest, waiting for room, which the
        reader awaits before the next message."""
        if binding.replay is not None:
            binding.replay.extend(update for _, update in updates)
            return None
        turn = binding.turn
        if turn is None:
            return None  # between turns (e.g. a late available_commands_update): nothing to journal it in
        own = binding.agent_session_id
        own_updates = [update for session_id, update in updates if session_id == own]
        backlog = self.spec.coalesce_backlog
        if backlog and len(own_updates) >= backlog:
            events = coalesce_updates(own_updates)
        else:
            events = [map_update(update) for update in own_updates]
        emit_nowait = turn.emit_nowait
        for index, (kind, payload) in enumerate(events):
            if not emit_nowait(kind, payload):
                return self._emit_waiting(binding, turn, events[index:])
        return None

    @staticmethod
    async def _emit_waiting(binding: Binding, turn: Turn, events: list[tuple[str, dict[str, Any]]]) -> None:
        for kind, payload in events:
            if binding.turn is not turn:
                return  # the turn ended meanwhile (cancelled, agent closed): nothing to journal the rest in
            await turn.emit(kind, payload)

    async def _on_permission(self, binding: Binding, params: dict[str, Any]) -> dict[str, Any]:
        turn = binding.turn
        if turn is None:
            return CANCELLED_PERMISSION
        tool_call = dict(params.get("toolCall") or {})
        options = [dict(o) for o in params.get("options") or []]
        if tool_call.get("kind") in self.spec.auto_allow_kinds:
            allow = next((o for o in options if o.get("kind") == "allow_once"), None)
            if allow is not None:
                await turn.emit(
                    "permission.resolved",
                    {"toolCall": tool_call, "optionId": allow.get("optionId"), "outcome": "selected", "by": "policy"},
                )
                return {"outcome": {"outcome": "selected", "optionId": allow.get("optionId")}}
        option_id = await turn.request_permission(tool_call, options, self.spec.permission_timeout)
        if option_id is None:
            return CANCELLED_PERMISSION
        return {"outcome": {"outcome": "selected", "optionId": option_id}}

    async def _on_read(self, binding: Binding, params: dict[str, Any]) -> dict[str, Any]:
        files = self._files(binding)
        try:
            text = await files.read_text(
                binding.turn, str(params.get("path", "")), params.get("line"), params.get("limit")
            )
        except Exception as exc:
            raise AcpRequestError(-32002, str(exc)) from exc
        return {"content": text}

    async def _on_write(self, binding: Binding, params: dict[str, Any]) -> dict[str, Any]:
        files = self._files(binding)
        try:
            await files.write_text(binding.turn, str(params.get("path", "")), str(params.get("content", "")))
        except Exception as exc:
            raise AcpRequestError(-32002, str(exc)) from exc
        return {}

    def _files(self, binding: Binding) -> Any:
        turn = binding.turn
        files = turn.files if turn is not None else None
        if files is None:
            raise AcpRequestError(-32603, "file access is not available outside a run")
        return files

    # -- the agent-session delete protocol (agent_gateway.agent_sessions) -----------------------

    def can_delete_agent_session(self) -> bool | None:
        """Whether the agent's ``initialize`` answer declares ``sessionCapabilities.delete``; None
        until a process of this agent has answered."""
        return _declares_delete(self.initialize_result)

    async def delete_agent_session(self, agent_session_id: str, state: dict[str, Any]) -> None:
        """Delete ``agent_session_id`` with a short-lived process of this agent: an idle live
        binding of that session is closed first (so no later turn prompts a deleted session), then
        the process is started, initialized, sent ``session/delete`` and stopped. Raises
        :class:`NotDeclared` when the agent does not declare it."""
        if self.can_delete_agent_session() is False:
            raise NotDeclared
        for binding in list(self._bindings.values()):
            if binding.agent_session_id == agent_session_id:
                with contextlib.suppress(Exception):
                    await self._close_binding(binding, "its agent session was deleted")
        spec = self.spec
        with contextlib.ExitStack() as stack:
            if spec.process_dir is not None:
                process_dir = spec.process_dir
                process_dir.mkdir(parents=True, exist_ok=True)
            else:
                scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"agw-{safe_name(self.agent_id)}-"))
                process_dir = Path(scratch)
            if spec.prepare is not None:
                spec.prepare(process_dir)
            process = AcpProcess(
                spec.command,
                env=agent_environment(spec.env, inherit=spec.inherit_env),
                cwd=str(process_dir),
                name=f"{spec.agent_id}-delete",
            )
            try:
                await process.start()
                result = await process.initialize(timeout=spec.initialize_timeout)
                if self.initialize_result is None:
                    self.initialize_result = result
                if not _declares_delete(result):
                    raise NotDeclared
                await process.request(ACP_DELETE_METHOD, {"sessionId": agent_session_id}, spec.session_timeout)
            finally:
                await process.close()

    async def close(self) -> None:
        for binding in list(self._bindings.values()):
            with contextlib.suppress(Exception):
                await self._close_binding(binding, "gateway shutdown")


def _declares_delete(initialize_result: dict[str, Any] | None) -> bool | None:
    if initialize_result is None:
        return None
    caps = initialize_result.get("agentCapabilities")
    session_caps = caps.get("sessionCapabilities") if isinstance(caps, dict) else None
    return isinstance(session_caps, dict) and session_caps.get("delete") is not None


class AcpSessionStrategy:
    """The session strategy of ACP runtimes (every :class:`AcpRuntime` carries one as its
    ``session_strategy``): live binding, then load, then cold resume."""

    async def plan(self, turn: Turn, runtime: Any) -> SessionPlan:
        return await runtime.bind(turn)


def _exit_code(error: AcpProcessExited, confined: bool) -> int | None:
    """The agent's exit code as if it were the gateway's own child: a sandbox reports its agent's
    death by signal N as exit code 128 + N (bubblewrap does); it is -N, as for any child."""
    code = error.returncode
    if confined and code is not None and code > 128:
        with contextlib.suppress(ValueError):
            return -signal.Signals(code - 128).value
    return code


def _exit_text(code: int | None) -> str:
    how = f"exited with code {code}"
    if code is not None and code < 0:
        how += f" (killed by signal {_signal_name(-code)})"
    return how


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:100] or "default"
