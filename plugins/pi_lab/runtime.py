"""The Pi-lab runtime: `pi --mode rpc` processes, one per live gateway-session binding.

A binding is keyed by (actor, gateway session, workspace, allowed roots, model): the same key
turn after turn reuses the live process (``native_live``); a change of any part closes the old
one. Without a live binding the Pi session named in the gateway session's stored state is
resumed with ``--session <file>`` and believed only when Pi reports the same session id with
messages in it (``loaded``); otherwise a new Pi session starts, seeded with the gateway's
cold-resume packet when the gateway session has earlier turns (``cold_resumed``).

Each actor has its own Pi home (the sandbox's per-actor agent home,
``<data_dir>/agent-homes/pi-lab/<actor>``): Pi's agent directory (``agent/``: ``models.json``,
``mcp.json``) and its JSONL session files (``sessions/<workspace>/``) live there, so nothing Pi
keeps crosses actors. Every process starts through the ``sandbox`` service (bubblewrap built in),
like the ACP runtimes' agents. The gateway's own record (``piSessionId``, ``sessionFile``,
``model``, ``allowedRoots``) is the runtime state of the gateway session, in storage.
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_gateway import (
    SHORT_REPLY_WARNING,
    AgentLaunch,
    ProcessCapacity,
    ProcessUse,
    RuntimePolicy,
    SandboxedCommand,
    SessionPlan,
    Turn,
    TurnOutcome,
    agent_environment,
    allowed_roots_of,
    cold_resume_packet,
    endpoint_of_url,
    has_context,
    is_bare_short_reply,
    program_paths,
    prompt_text,
)

from .mapping import EventMapper
from .rpc import PiError, PiExited, PiProcess

log = logging.getLogger(__name__)

AGENT_ID = "pi-lab"
PROVIDER_NAME = "gateway"
# Pi is started with nothing of its own: no built-in tools, no extensions but MCP, no context
# files (AGENTS.md ...), and project-local `.pi/` settings ignored (no project trust).
LOCKDOWN_ARGS = ["--no-builtin-tools", "--no-extensions", "-e", "builtin:mcp", "--no-context-files", "--no-approve"]


@dataclass
class PiSettings:
    command: list[str]
    env: dict[str, str]
    root: Path  # <data_dir>/runtimes/pi (before per-actor homes: its sessions/ are migrated)
    provider_base_url: str = ""
    provider_model: str = ""
    provider_api_key: str = ""
    idle_seconds: float = 900.0
    extra_args: list[str] = field(default_factory=list)
    max_processes: int = 4
    # Processes one actor may hold (0: all `max_processes`), and how long a turn waits for one.
    max_processes_per_actor: int = 2
    process_wait_seconds: float = 300.0
    mcp_servers: dict[str, Any] = field(default_factory=dict)
    # True: Pi gets the gateway's whole environment instead of the base agent environment.
    inherit_env: bool = False
    start_timeout: float = 30.0
    cancel_grace: float = 10.0
    # (host, port) endpoints Pi may reach from its sandbox besides its model endpoint and the MCP surface.
    network: list[tuple[str, int]] = field(default_factory=list)
    # More paths Pi may read inside its sandbox (its install is found from `command`).
    read_only: list[Path] = field(default_factory=list)

    @property
    def legacy_sessions_root(self) -> Path:
        """Where a gateway before per-actor homes kept every actor's sessions."""
        return self.root / "sessions"

    def model_endpoints(self) -> list[tuple[str, int]]:
        endpoint = endpoint_of_url(self.provider_base_url) if self.provider_base_url else None
        return [endpoint] if endpoint else []


def safe_name(value: str) -> str:
    """A directory name for an id: readable, never `..`, collision-free through a short hash."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", value).strip(".")[:48] or "_"
    return f"{cleaned}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def write_models_json(agent_dir: Path, base_url: str, model: str, api_key: str) -> None:
    data = {
        "providers": {
            PROVIDER_NAME: {
                "baseUrl": base_url,
                "api": "openai-completions",
                "apiKey": api_key or "unused",
                "models": [{"id": model or "default"}],
            }
        }
    }
    _write_json(agent_dir / "models.json", data)


def _write_json(path: Path, data: Any) -> None:
    """Write ``data`` unless the file already holds it: a running Pi of the same actor may be
    reading it, and an unchanged file keeps the owner the sandbox gave it."""
    text = json.dumps(data, indent=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text:
            return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def acp_to_pi_mcp(entry: dict[str, Any], env_out: dict[str, str]) -> tuple[str, dict[str, Any]] | None:
    """Convert one ACP ``mcpServers`` entry (stdio ``{name, command, args, env:[{name,value}]}``
    or HTTP ``{type: http, name, url, headers:[{name,value}]}``) to a Pi ``mcp.json`` entry.

    Secret values (env and header values) are not written to the shared file: they go into the
    Pi process's environment (``env_out``) and the file refers to them as ``${VAR}``."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(entry.get("name") or "gateway"))
    out: dict[str, Any] = {"exposure": "direct", "description": "Gateway tools (files, knowledge)"}

    def secret(value: Any, key: str) -> str:
        var = "AG_PI_MCP_" + re.sub(r"[^A-Z0-9]", "_", f"{name}_{key}".upper())
        env_out[var] = str(value)
        return "${" + var + "}"

    if entry.get("url"):
        out["type"] = "http" if entry.get("type") in (None, "http", "streamable-http") else entry["type"]
        out["url"] = entry["url"]
        headers = entry.get("headers") or []
        pairs = headers.items() if isinstance(headers, dict) else [(h.get("name"), h.get("value")) for h in headers]
        out["headers"] = {str(k): secret(v, f"h_{k}") for k, v in pairs if k}
    elif entry.get("command"):
        out["command"] = entry["command"]
        out["args"] = [str(a) for a in entry.get("args") or []]
        env = entry.get("env") or []
        pairs = env.items() if isinstance(env, dict) else [(e.get("name"), e.get("value")) for e in env]
        out["env"] = {str(k): secret(v, f"e_{k}") for k, v in pairs if k}
        if entry.get("cwd"):
            out["cwd"] = entry["cwd"]
    else:
        return None
    return name, out


def _resumable(session_dir: Path, stored_file: str | None) -> Path | None:
    """Make the session directory; the stored session file when it is still there, inside it."""
    session_dir.mkdir(parents=True, exist_ok=True)
    if stored_file is None:
        return None
    candidate = Path(stored_file)
    with contextlib.suppress(OSError, ValueError):
        if candidate.is_file() and candidate.resolve().is_relative_to(session_dir.resolve()):
            return candidate
    return None


def _migrate_sessions(legacy: Path, session_dir: Path, stored_file: str | None) -> str | None:
    """Move one actor's session folder of a workspace from the shared pre-home layout into the
    actor's home (once); the stored session file's path, moved with it."""
    if legacy.is_dir() and not session_dir.exists():
        session_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(legacy), str(session_dir))
    if stored_file is not None:
        with contextlib.suppress(ValueError):
            return str(session_dir / Path(stored_file).relative_to(legacy))
    return stored_file


@dataclass
class BindingKey:
    actor_id: str
    session_id: str
    workspace_id: str
    roots: tuple[str, ...]
    model: str

    def astuple(self) -> tuple[Any, ...]:
        return (self.actor_id, self.session_id, self.workspace_id, self.roots, self.model)


@dataclass
class Binding:
    key: BindingKey
    process: PiProcess
    pi_session_id: str
    session_file: str
    turn: Turn | None = None
    last_used: float = field(default_factory=time.monotonic)
    evict: asyncio.TimerHandle | None = None
    closed: bool = False

    @property
    def alive(self) -> bool:
        return not self.closed and self.process.alive


class PiRuntime:
    agent_id = AGENT_ID
    display_name = "Pi (lab)"
    provider = "pi"

    def __init__(self, settings: PiSettings) -> None:
        self.settings = settings
        self.policy = RuntimePolicy(
            context_carrier="agent_session",
            load_session=True,  # Pi resumes its session file after a restart (`loaded`)
            mcp_http=True,
            extra={"steer": True, "followUp": True},
        )
        # The core's default `session_strategy` uses this: live binding, then resume, then cold resume.
        self.session_strategy = PiSessionStrategy()
        self.bindings: dict[tuple[Any, ...], Binding] = {}
        self.capacity = ProcessCapacity(
            AGENT_ID, settings.max_processes, settings.max_processes_per_actor, settings.process_wait_seconds
        )
        self._mcp_lock = asyncio.Lock()

    # -- descriptor ---------------------------------------------------------------------------
    def _binary(self) -> str | None:
        first = self.settings.command[0] if self.settings.command else ""
        if os.path.isfile(first) and os.access(first, os.X_OK):
            return first
        # Looked up on the PATH Pi itself will get.
        environment = agent_environment(self.settings.env, inherit=self.settings.inherit_env)
        return shutil.which(first, path=environment.get("PATH"))

    def describe(self) -> dict[str, Any]:
        found = self._binary() is not None
        return {
            "capabilities": ["chat", "tools.mcp", "steer", "follow_up", "session.resume"],
            "toolAccess": True,
            "fields": [{"key": "model", "label": "Model", "kind": "string", "default": self.settings.provider_model}],
            "availability": {
                "available": found,
                "binaryFound": found,
                "upstreamConfigured": bool(self.settings.provider_base_url),
                "reason": None if found else self._missing_reason(),
            },
        }

    def _missing_reason(self) -> str:
        first = self.settings.command[0] if self.settings.command else "?"
        if os.sep in first:
            where = "is not an executable file"
        else:
            path = agent_environment(self.settings.env, inherit=self.settings.inherit_env).get("PATH", "")
            where = f"not found on the agent's PATH ({path[:300]}{'…' if len(path) > 300 else ''})"
        return (
            f"{first} {where}: install it with `npm install -g @earendil-works/pi-coding-agent` "
            "(Node 22.19 or later) or set [pi_lab] command"
        )

    # -- bindings -------------------------------------------------------------------------------
    def key_for(self, turn: Turn) -> BindingKey:
        run = turn.run
        roots = tuple(sorted(r for r in turn.context.get("allowedRoots") or [] if isinstance(r, str)))
        model = turn.options.get("model")
        model = model if isinstance(model, str) and model else self.settings.provider_model
        return BindingKey(run.actor_id, run.session_id, run.workspace_id, roots, model)

    def binding_for_run(self, host_run_id: str) -> Binding | None:
        for binding in self.bindings.values():
            if binding.turn is not None and binding.turn.run.host_run_id == host_run_id:
                return binding
        return None

    async def bind(self, turn: Turn) -> SessionPlan:
        """Find or make the Pi session for this turn; sets ``turn.binding``."""
        key = self.key_for(turn)
        binding = self.bindings.get(key.astuple())
        if binding is not None and binding.alive:
            if binding.evict is not None:
                binding.evict.cancel()
                binding.evict = None
            binding.turn = turn  # taken: no eviction until the turn has run (run_turn lets go)
            turn.binding = binding
            return SessionPlan("native_live", detail={"piSessionId": binding.pi_session_id})
        if binding is not None:
            await self._close(binding, "its process had exited")
        # Another live binding of the same gateway session (other roots/model/workspace) is closed.
        for other in [b for b in self.bindings.values() if b.key.astuple()[:2] == key.astuple()[:2]]:
            await self._close(other, "the session's workspace, roots or model changed")
        async with self._process_slot(turn, key.actor_id):
            return await self._start(turn, key)

    async def _start(self, turn: Turn, key: BindingKey) -> SessionPlan:
        """Start the Pi process of a new binding (its slot is counted) and find its session."""
        state = turn.state or {}
        home = self.home_for(turn)
        session_dir = home / "sessions" / safe_name(key.workspace_id)
        stored = state.get("sessionFile")
        same_workspace = state.get("workspaceId", key.workspace_id) == key.workspace_id
        legacy = self.settings.legacy_sessions_root / safe_name(key.workspace_id) / safe_name(key.actor_id)
        stored_file = await asyncio.to_thread(
            _migrate_sessions, legacy, session_dir, stored if isinstance(stored, str) and same_workspace else None
        )
        resume = await asyncio.to_thread(_resumable, session_dir, stored_file)
        process = await self._spawn(turn, key, home, session_dir, resume)
        try:
            info = await process.request({"type": "get_state"}, timeout=self.settings.start_timeout)
        except BaseException:
            await process.close()
            raise
        pi_session_id = str(info.get("sessionId") or "")
        session_file = str(info.get("sessionFile") or "")
        binding = Binding(key, process, pi_session_id, session_file, turn=turn)  # taken (see above)
        self.bindings[key.astuple()] = binding
        turn.binding = binding
        await turn.save_state(
            {
                "piSessionId": pi_session_id,
                "sessionFile": session_file,
                "model": key.model,
                "allowedRoots": list(key.roots),
                "workspaceId": key.workspace_id,
            }
        )
        detail: dict[str, Any] = {"piSessionId": pi_session_id}
        if resume is not None:
            count = int(info.get("messageCount") or 0)
            if pi_session_id == state.get("piSessionId") and count > 0:
                return SessionPlan("loaded", detail={**detail, "messageCount": count, "sessionFile": session_file})
            detail["loadFailed"] = (
                f"pi did not resume {state.get('piSessionId')} (got {pi_session_id}, {count} messages)"
            )
        packet = cold_resume_packet(turn.history)
        if packet:
            return SessionPlan("cold_resumed", packet, detail=detail)
        warning = None
        if is_bare_short_reply(turn.message) and not has_context(turn.context):
            warning = SHORT_REPLY_WARNING
        return SessionPlan("new_session", [], warning, detail=detail)

    def home_for(self, turn: Turn) -> Path:
        """Pi's own home for the run's actor: its agent directory and sessions never cross actors."""
        sandbox = turn.sandbox
        if sandbox is not None:
            return Path(sandbox.home_for(AGENT_ID, turn.run.actor_id))
        return turn.data_dir / "agent-homes" / AGENT_ID / safe_name(turn.run.actor_id)

    def _launch(self, turn: Turn, key: BindingKey, home: Path, session_dir: Path, resume: Path | None) -> AgentLaunch:
        """What Pi's process for this binding needs: see :class:`agent_gateway.AgentLaunch`."""
        s = self.settings
        # The base agent environment (or the gateway's with inherit_env), the section's env, then
        # what Pi needs from the gateway: offline, no telemetry, the actor's own agent directory.
        env = agent_environment(
            {**s.env, "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "PI_CODING_AGENT_DIR": str(home / "agent")},
            inherit=s.inherit_env,
        )
        env["HOME"] = str(home)
        argv = [*s.command, "--mode", "rpc", *LOCKDOWN_ARGS, "--session-dir", str(session_dir)]
        if s.provider_base_url:
            argv += ["--provider", PROVIDER_NAME, "--model", key.model or "default"]
        elif key.model:
            argv += ["--model", key.model]
        if resume is not None:
            argv += ["--session", str(resume)]
        argv += list(s.extra_args)
        root = turn.workspace_roots.get(key.workspace_id)
        workspace_root = Path(root) if root is not None else None
        # A run without a workspace folder gets an empty one of Pi's own, never the gateway's.
        workspace_dir = workspace_root if workspace_root is not None else home / "no-workspace"
        writable: list[tuple[Path, Path]] = []
        if workspace_root is not None:
            for allowed in allowed_roots_of(workspace_root, list(key.roots)):
                if allowed.absolute is not None:
                    writable.append((allowed.absolute, workspace_dir / allowed.label.rstrip("/")))
        data_dir = str(turn.data_dir)
        base_url = turn.base_url
        return AgentLaunch(
            agent_id=AGENT_ID,
            actor_id=key.actor_id,
            workspace_id=key.workspace_id,
            command=argv,
            env=env,
            cwd=workspace_dir,
            home=home,
            workspace_dir=workspace_dir,
            writable=writable,
            read_only=[*program_paths(list(s.command), env.get("PATH"), [data_dir]), *s.read_only],
            network=[*dict.fromkeys([*s.model_endpoints(), *s.network])],
            mcp_url=str(base_url) if base_url else None,
        )

    async def _spawn(
        self, turn: Turn, key: BindingKey, home: Path, session_dir: Path, resume: Path | None
    ) -> PiProcess:
        s = self.settings
        launch = self._launch(turn, key, home, session_dir, resume)
        sandbox = turn.sandbox
        await asyncio.to_thread(self._prepare_home, launch)
        if sandbox is not None:
            command: SandboxedCommand = await sandbox.confine(launch)
        else:
            command = SandboxedCommand(
                list(launch.command), dict(launch.env), str(launch.cwd), "none: no sandbox service", confined=False
            )
        # mcp.json names the gateway's MCP surface where Pi reaches it: inside its sandbox, that is
        # the sandbox's own loopback address for it.
        env = dict(command.env)
        env.update(await self._write_mcp_json(turn, home, command.mcp_base_url))
        if sandbox is not None:
            await asyncio.to_thread(sandbox.prepare_home, home)  # Pi's user owns its home
        process = PiProcess(command.argv, env, Path(command.cwd))
        try:
            await process.start()
        except FileNotFoundError as exc:
            if command.cleanup is not None:
                await command.cleanup()
            raise RuntimeError(
                f"pi-lab: cannot start {s.command[0]!r} ({exc.strerror}); install "
                "@earendil-works/pi-coding-agent (contrib/peers/install.sh) or set [pi_lab] command"
            ) from exc
        if command.cleanup is not None:
            command.clean_up_after(process.exited.wait)
        log.info("pi process %s for %s: %s", process.pid, key.actor_id, command.confinement)
        return process

    def _prepare_home(self, launch: AgentLaunch) -> None:
        s = self.settings
        for directory in (launch.home / "agent", launch.workspace_dir, launch.cwd):
            directory.mkdir(parents=True, exist_ok=True)
        if s.provider_base_url:
            write_models_json(launch.home / "agent", s.provider_base_url, s.provider_model, s.provider_api_key)

    async def _write_mcp_json(self, turn: Turn, home: Path, base_url: str | None) -> dict[str, str]:
        """Write ``<home>/agent/mcp.json`` (the configured servers plus the gateway's own MCP
        surface for this binding, at ``base_url`` when Pi reaches it there); returns the
        environment its ``${VAR}`` references need."""
        env: dict[str, str] = {}
        servers: dict[str, Any] = dict(self.settings.mcp_servers)
        entries: list[dict[str, Any]] = []
        try:
            entries = list(turn.mcp_servers(self.policy, base_url=base_url))
        except Exception:
            log.exception("the gateway's MCP servers could not be listed; pi starts without the gateway tools")
        for entry in entries:
            converted = acp_to_pi_mcp(entry, env)
            if converted is not None:
                servers[converted[0]] = converted[1]
        async with self._mcp_lock:  # one writer at a time; the structure is the same for every process
            await asyncio.to_thread(_write_json, home / "agent" / "mcp.json", {"mcpServers": servers})
        return env

    def _schedule_eviction(self, binding: Binding) -> None:
        if binding.evict is not None:
            binding.evict.cancel()
        loop = asyncio.get_running_loop()

        def fire() -> None:
            if binding.turn is None and not binding.closed:
                task = loop.create_task(self._close(binding, "idle"))
                task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

        binding.evict = loop.call_later(self.settings.idle_seconds, fire)

    def _process_slot(self, turn: Turn, actor_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Room for one more Pi process of `actor_id` (the fair-share rule of
        `agent_gateway.capacity`), counted while it starts; waits up to `process_wait_seconds`."""

        async def waiting(message: str) -> None:
            wait = self.settings.process_wait_seconds
            await turn.emit("run.waiting", {"reason": "agent_capacity", "message": message, "waitSeconds": wait})

        return self.capacity.reserve(actor_id, self._process_uses, self._close, on_wait=waiting)

    def _process_uses(self) -> list[ProcessUse]:
        return [
            ProcessUse(b.key.actor_id, b.turn is not None, b.last_used, b) for b in self.bindings.values() if b.alive
        ]

    async def _close(self, binding: Binding, reason: str) -> None:
        binding.closed = True
        if binding.evict is not None:
            binding.evict.cancel()
        if self.bindings.get(binding.key.astuple()) is binding:
            del self.bindings[binding.key.astuple()]
        log.info("closing pi session %s: %s", binding.pi_session_id, reason)
        try:
            await binding.process.close()
        finally:
            self.capacity.changed()

    async def close(self) -> None:
        for binding in list(self.bindings.values()):
            await self._close(binding, "gateway shutdown")

    # -- turns ------------------------------------------------------------------------------------
    def prompt_text(self, turn: Turn) -> str:
        return prompt_text(turn)

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        binding: Binding | None = turn.binding
        if binding is None:  # no strategy ran (a plugin replaced it): bind now
            plan = await self.bind(turn)
            turn.plan = plan
            await turn.set_session_mode(plan.mode, plan.detail)
            binding = turn.binding
        assert binding is not None
        await turn.set_provider_run_id(binding.pi_session_id)
        binding.turn = turn
        process = binding.process
        records: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        process.backlog.clear()  # records from between turns (nothing of this run)
        process.listener = records.put_nowait
        mapper = EventMapper()
        try:
            return await self._drive(turn, binding, records, mapper)
        finally:
            process.listener = None
            binding.turn = None
            binding.last_used = time.monotonic()
            self.capacity.changed()  # an idle binding may make room for a waiting turn
            if binding.alive:
                self._schedule_eviction(binding)
            elif not binding.closed:
                await self._close(binding, "its process exited")

    async def _drive(
        self, turn: Turn, binding: Binding, records: asyncio.Queue[dict[str, Any]], mapper: EventMapper
    ) -> TurnOutcome:
        process = binding.process
        try:
            accepted = await process.request(
                {"type": "prompt", "message": self.prompt_text(turn)}, timeout=self.settings.start_timeout
            )
        except PiError as exc:
            return TurnOutcome("failed", f"pi refused the prompt: {exc}")
        except PiExited as exc:
            return TurnOutcome("failed", str(exc))
        except TimeoutError:
            await self._close(binding, "it did not accept the prompt")
            return TurnOutcome("failed", f"pi did not accept the prompt within {self.settings.start_timeout:g} s")
        if accepted.get("disposition") == "handled":
            return TurnOutcome("completed", detail={"disposition": "handled"})
        cancel_wait = asyncio.ensure_future(turn.cancel_requested.wait())
        abort_task: asyncio.Task[Any] | None = None
        deadline: float | None = None
        try:
            while True:
                getter = asyncio.ensure_future(records.get())
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                waiters: set[asyncio.Future[Any]] = {getter}
                if abort_task is None:
                    waiters.add(cancel_wait)
                done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    if abort_task is None and cancel_wait in done:
                        abort_task = asyncio.ensure_future(process.request({"type": "abort"}, timeout=60))
                        deadline = time.monotonic() + self.settings.cancel_grace
                        continue
                    # The abort did not settle in time: this process is not trusted with the session.
                    await self._close(binding, "it did not stop after abort")
                    return TurnOutcome("cancelled", "cancelled; pi did not stop in time and was closed")
                record = getter.result()
                if record.get("type") == "_exited":
                    error = process.exit_error()
                    if abort_task is not None:
                        return TurnOutcome("cancelled", f"cancelled; {error}")
                    return TurnOutcome("failed", str(error))
                if record.get("type") == "extension_ui_request":
                    await self._answer_ui(process, record)
                for kind, payload in mapper.map(record):
                    await turn.emit(kind, payload)
                if mapper.settled:
                    break
        finally:
            cancel_wait.cancel()
            if abort_task is not None and not abort_task.done():
                # abort answers once Pi is idle, i.e. about now; don't leave it dangling.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2.0):
                        await abort_task
                abort_task.cancel()
        if mapper.aborted or abort_task is not None or turn.cancel_requested.is_set():
            return TurnOutcome("cancelled", "cancelled (pi aborted the run)")
        if mapper.error:
            return TurnOutcome("failed", mapper.error)
        return TurnOutcome("completed")

    async def _answer_ui(self, process: PiProcess, record: dict[str, Any]) -> None:
        """Dialogs from an extension block Pi until answered; the gateway has no UI for them."""
        if record.get("method") in ("select", "confirm", "input", "editor") and record.get("id"):
            with contextlib.suppress(Exception):
                await process.send({"type": "extension_ui_response", "id": record["id"], "cancelled": True})

    # -- steering -----------------------------------------------------------------------------
    async def _queue(self, host_run_id: str, command: str, message: str) -> dict[str, Any]:
        binding = self.binding_for_run(host_run_id)
        if binding is None or binding.turn is None:
            raise LookupError(f"run {host_run_id} is not running on pi-lab")
        data = await binding.process.request({"type": command, "message": message})
        kind = "user.steer" if command == "steer" else "user.follow_up"
        await binding.turn.emit(kind, {"text": message, "disposition": data.get("disposition")})
        return data

    async def steer(self, host_run_id: str, message: str) -> dict[str, Any]:
        """Send a steering message into a running turn: Pi delivers it after the current tool calls,
        before its next model call. The answer stays part of the same gateway run."""
        return await self._queue(host_run_id, "steer", message)

    async def follow_up(self, host_run_id: str, message: str) -> dict[str, Any]:
        """Queue a follow-up for a running turn: Pi takes it up when the agent would otherwise
        stop; the run ends only when Pi settles after it."""
        return await self._queue(host_run_id, "follow_up", message)


class PiSessionStrategy:
    """The session strategy a :class:`PiRuntime` carries as its ``session_strategy``."""

    async def plan(self, turn: Turn, runtime: Any) -> SessionPlan:
        return await runtime.bind(turn)
