"""Agent processes run confined: what a sandbox is given and what it gives back.

Every agent process is treated as hostile: a prompt can make it call any tool it has, read any file
it can see and connect anywhere it can reach. So no runtime starts an agent directly. It describes
the start as an :class:`AgentLaunch` (command, environment, working directory, the actor, the
workspace and the parts of it the run may write, the agent's per-actor home, what it must read and
which network endpoints it needs) and asks :class:`Sandbox` to :meth:`~Sandbox.confine` it; the
``sandbox_agent`` hook (runtime-policy family) turns the launch into the command that actually
starts it. The built-in implementation is bubblewrap (:mod:`agent_gateway.sandbox.bubblewrap`,
``trylast``): a plugin may confine agents with nsjail, firejail, a container runtime or gVisor
instead.

``[sandbox] mode``: ``required`` refuses to start an agent no plugin can confine (one-line reason);
``auto`` (the default) confines wherever a sandbox works and says once, loudly, when it cannot;
``off`` runs agents unconfined (explicit).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import os
import pwd
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("agent_gateway.sandbox")

SECTION = "sandbox"
MODES = ("auto", "required", "off")
SECTION_DEFAULTS: dict[str, Any] = {
    # "auto": confine wherever a sandbox works (say once, loudly, where it does not); "required":
    # refuse to start an agent that cannot be confined; "off": run agents unconfined.
    "mode": "auto",
    # Who agents run as when the gateway runs as root: a user name or a numeric uid (its primary
    # group, or uid for gid). Empty: "nobody" (65534). Ignored when the gateway is not root:
    # agents then run as the gateway's own user, in namespaces of their own.
    "run_as": "",
    # Paths every agent may read (besides the system directories, its own install and the
    # gateway's interpreter, which are always visible).
    "read_only": [],
    # host:port endpoints every agent may reach (besides its own model endpoint and the gateway's
    # MCP surface).
    "network": [],
    # Paths no agent may see even when they lie inside something it may read.
    "hide": [],
}

# Where the gateway's sockets appear inside a sandbox.
SANDBOX_RUN_DIR = "/run/agent-gateway"
EGRESS_SOCKET = "egress.sock"
MCP_SOCKET = "mcp.sock"


class SandboxError(RuntimeError):
    """An agent cannot be started confined (``[sandbox] mode = "required"``), or its launch is
    not allowed; the message is one line."""


@dataclass
class SandboxedCommand:
    """How to start a confined agent: run ``argv`` with exactly ``env`` in ``cwd``.

    ``confinement`` is one line for operators (``agent-gateway doctor``, the log, the run's
    ``session.info.updated``); ``mcp_base_url`` is the gateway URL the agent reaches its MCP
    surface on from inside (None: the gateway's own); ``cleanup`` is awaited once the process has
    exited."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    confinement: str
    confined: bool = True
    mcp_base_url: str | None = None
    cleanup: Callable[[], Awaitable[None]] | None = None

    def clean_up_after(self, exited: Callable[[], Awaitable[Any]]) -> None:
        """Run ``cleanup`` (if any) once ``exited()`` returns: call it right after the process
        started, with what waits for its end."""
        cleanup = self.cleanup
        if cleanup is None:
            return

        async def wait_then_clean() -> None:
            try:
                await exited()
            finally:
                await cleanup()

        task = asyncio.get_running_loop().create_task(wait_then_clean())
        _CLEANUPS.add(task)
        task.add_done_callback(_CLEANUPS.discard)


# The cleanups waiting for their processes (a task nothing holds may be collected mid-wait).
_CLEANUPS: set[asyncio.Task[None]] = set()


@dataclass
class AgentLaunch:
    """One agent process about to start, as a sandbox sees it.

    Paths are host paths; a sandbox shows each at the same path inside unless it says otherwise.
    ``writable`` maps the parts of the workspace the run may write (its allowed roots, resolved)
    to where the agent sees them; nothing else of the workspace is visible. ``workspace_dir`` is
    the directory the agent is told is its workspace (its ACP ``cwd``): it exists inside, holding
    only the writable roots. ``home`` is the agent's own per-actor home (read-write).
    ``read_only`` is what the agent must read: its install, its interpreter, the gateway's bridge.
    ``network`` lists the ``(host, port)`` endpoints it may reach; ``mcp_url`` is the gateway URL
    its MCP client calls back on (reached through the sandbox, never the whole HTTP API)."""

    agent_id: str
    actor_id: str
    workspace_id: str
    command: list[str]
    env: dict[str, str]
    cwd: Path
    home: Path
    workspace_dir: Path
    writable: list[tuple[Path, Path]] = field(default_factory=list)
    read_only: list[Path] = field(default_factory=list)
    hide: list[Path] = field(default_factory=list)
    network: list[tuple[str, int]] = field(default_factory=list)
    mcp_url: str | None = None
    # The gateway's interpreter (for the in-sandbox network supervisor and the MCP stdio bridge).
    python: str = ""
    # Opens the host end of the sandbox's network (see :mod:`agent_gateway.sandbox.egress`).
    open_egress: Callable[[list[tuple[str, int]]], Awaitable[Any]] | None = None
    # The gateway's MCP-only Unix socket (serves `/v1/mcp` and nothing else), when one is open.
    mcp_socket: Path | None = None
    # Who the agent runs as where the gateway is root: (uid, gid).
    run_as: tuple[int, int] | None = None


def parse_endpoint(text: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:8080"`` for IPv6) → ``(host, port)``; ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


def endpoint_of_url(url: str) -> tuple[str, int] | None:
    """The ``(host, port)`` an http(s) URL connects to; None for anything else."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def validate_section(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if section["mode"] not in MODES:
        problems.append(("mode", 'must be "auto", "required" or "off"'))
    if section["run_as"]:
        try:
            resolve_user(str(section["run_as"]))
        except ValueError as exc:
            problems.append(("run_as", str(exc)))
    for key in ("read_only", "hide"):
        if not all(isinstance(p, str) and os.path.isabs(os.path.expanduser(p)) for p in section[key]):
            problems.append((key, "must be a list of absolute paths"))
    for index, item in enumerate(section["network"]):
        try:
            parse_endpoint(str(item))
        except ValueError as exc:
            problems.append((f"network[{index}]", str(exc)))
    return problems


def resolve_user(text: str) -> tuple[int, int]:
    """A user name or numeric uid → (uid, gid)."""
    if text.isdigit():
        uid = int(text)
        try:
            return uid, pwd.getpwuid(uid).pw_gid
        except KeyError:
            return uid, uid
    try:
        entry = pwd.getpwnam(text)
    except KeyError:
        raise ValueError(f"no user {text!r} on this machine") from None
    return entry.pw_uid, entry.pw_gid


def safe_name(text: str) -> str:
    """A directory name for an id (actor, agent, workspace): readable, and distinct ids never
    share one (a short hash of the id is appended whenever the text had to change)."""
    clean = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80].lstrip(".") or "_"
    if clean != text:
        clean += "-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return clean


def write_home_file(path: Path, text: str) -> None:
    """Write a file the gateway keeps in an agent's home (its config): through a new file and a
    rename, so that whatever the agent left at ``path`` (a symlink to a file of the gateway's) is
    replaced, never written through. The folder itself must not be a symlink."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink():
        raise SandboxError(f"{folder} is a symlink; refusing to write {path.name} through it")
    temporary = folder / f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# -- what an agent must read ---------------------------------------------------------------------

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Files and directories of /etc a program needs: certificates, name resolution, users, time zone,
# the dynamic linker's cache. Never /etc as a whole (it may hold the gateway's config).
SYSTEM_ETC = (
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "resolv.conf",
    "hosts",
    "host.conf",
    "gai.conf",
    "nsswitch.conf",
    "services",
    "protocols",
    "passwd",
    "group",
    "localtime",
    "timezone",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "mime.types",
    "os-release",
    "debian_version",
    "terminfo",
    "locale.alias",
    "bash.bashrc",
    "profile",
    "inputrc",
)


def _is_system(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in (*SYSTEM_DIRS, "/etc"))


def _ancestors(path: str) -> list[str]:
    out: list[str] = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return out
        out.append(parent)
        path = parent


def _shebang(path: str) -> list[str]:
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    return line.split()


def _install_dirs(path: str, home: str, avoid: list[str]) -> list[str]:
    """The directories that make up the program at ``path``: its directory; a Python venv (with
    its base interpreter) or a ``node_modules`` it lies in; the ``<prefix>`` of ``<prefix>/bin``
    unless that prefix holds the user's home or data."""
    found: list[str] = []
    for candidate in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
        directory = os.path.dirname(candidate)
        found.append(directory)
        for parent in [directory, *_ancestors(directory)]:
            if os.path.basename(parent) == "node_modules":
                found.append(parent)
                break
            config = os.path.join(parent, "pyvenv.cfg")
            if os.path.isfile(config):
                found.append(parent)
                found.extend(_venv_base(config))
                break
        if os.path.basename(directory) == "bin":
            prefix = os.path.dirname(directory)
            if prefix not in ("/", home) and not any(a == prefix or a.startswith(prefix + "/") for a in [home, *avoid]):
                found.append(prefix)
    return found


def _venv_base(config: str) -> list[str]:
    try:
        with open(config, encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    base_bin = os.path.realpath(value.strip())
                    return [os.path.dirname(base_bin) if os.path.basename(base_bin) == "bin" else base_bin]
    except OSError:
        pass
    return []


def program_paths(command: list[str], search_path: str | None, avoid: list[str]) -> list[Path]:
    """What an agent's command needs to read: the program, found on ``search_path`` like the
    process start does, its install (venv, ``node_modules``, prefix), the interpreter of a
    script (recursively, ``#!/usr/bin/env X`` included), and any absolute path among its
    arguments that exists. ``avoid``: directories whose ancestors are never returned whole (the
    gateway's data directory, config); system directories are left out (always visible)."""
    home = os.path.expanduser("~")
    out: list[str] = []
    todo: list[str] = []
    if command:
        first = command[0] if os.sep in command[0] else shutil.which(command[0], path=search_path)
        if first:
            todo.append(first)
        todo.extend(arg for arg in command[1:] if os.path.isabs(arg) and os.path.exists(arg))
    seen: set[str] = set()
    for _ in range(16):  # interpreters of interpreters: bounded
        if not todo:
            break
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if os.path.isdir(path):
            out.append(path)
            continue
        out.extend(_install_dirs(path, home, avoid))
        interpreter = _shebang(path)
        if interpreter:
            target = interpreter[0]
            if os.path.basename(target) == "env" and len(interpreter) > 1:
                found = shutil.which(interpreter[-1], path=search_path)
                target = found or ""
            if target and os.path.exists(target):
                todo.append(target)
    return [Path(p) for p in dict.fromkeys(out) if p and not _is_system(p) and os.path.exists(p)]


def gateway_program_paths() -> list[Path]:
    """What the gateway's own helpers need inside a sandbox (the network supervisor, the MCP stdio
    bridge): its interpreter, its site-packages and the ``agent_gateway`` package's folders."""
    import importlib.util
    import site
    import sys

    paths = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
    with contextlib.suppress(Exception):
        paths.extend(site.getsitepackages())
    for name in ("agent_gateway", "agent_gateway.hookspecs", "agent_gateway.plugins", "click"):
        with contextlib.suppress(Exception):
            spec = importlib.util.find_spec(name)
            if spec is not None:
                paths.extend(spec.submodule_search_locations or [])
    return [
        Path(p) for p in dict.fromkeys(os.path.realpath(p) for p in paths) if os.path.exists(p) and not _is_system(p)
    ]


# -- the service runtimes use ------------------------------------------------------------------


class SandboxHooks(Protocol):
    """The hook :class:`Sandbox` asks (the plugin host's ``sandbox_agent`` facade)."""

    def sandbox_agent(self, launch: AgentLaunch) -> Any: ...


class Sandbox:
    """Confines agent launches: asks the ``sandbox_agent`` hook, applies ``[sandbox] mode``."""

    def __init__(
        self,
        section: dict[str, Any],
        plugins: SandboxHooks | None,
        *,
        data_dir: Path,
        config_path: Path | None = None,
        egress: Callable[[list[tuple[str, int]]], Awaitable[Any]] | None = None,
        mcp_socket: Callable[[], Awaitable[Path | None]] | None = None,
    ) -> None:
        self.mode = str(section.get("mode", "auto"))
        self.read_only = [Path(os.path.expanduser(p)) for p in section.get("read_only", [])]
        self.network = [parse_endpoint(str(e)) for e in section.get("network", [])]
        self.hide = [Path(os.path.expanduser(p)) for p in section.get("hide", [])]
        self.run_as = resolve_user(str(section["run_as"])) if section.get("run_as") else (65534, 65534)
        self.plugins = plugins
        self.data_dir = data_dir
        self.config_path = config_path
        self._egress = egress
        self._mcp_socket = mcp_socket
        self._warned = False
        # agent id → the last launch's one-line confinement (for `doctor` and descriptors).
        self.confinements: dict[str, str] = {}

    def homes_root(self) -> Path:
        return self.data_dir / "agent-homes"

    def home_for(self, agent_id: str, actor_id: str) -> Path:
        """The agent's own home for one actor: sessions, memory and indexes never cross actors."""
        return self.homes_root() / safe_name(agent_id) / safe_name(actor_id)

    def empty_workspace(self, agent_id: str, actor_id: str) -> Path:
        """The working directory of a run with no workspace directory: empty, the agent's own."""
        return self.home_for(agent_id, actor_id) / "no-workspace"

    def prepare_home(self, home: Path) -> None:
        """Create the home; where agents run as another user, hand the tree to that user."""
        home.mkdir(parents=True, exist_ok=True)
        if self.mode == "off" or os.geteuid() != 0:
            return
        uid, gid = self.run_as
        for root, dirs, files in os.walk(home):
            for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
                with contextlib.suppress(OSError):
                    os.lchown(name, uid, gid)

    def hidden_paths(self) -> list[Path]:
        hidden = [self.data_dir, *self.hide]
        if self.config_path is not None:
            hidden.append(self.config_path)
        return hidden

    async def confine(self, launch: AgentLaunch) -> SandboxedCommand:
        """The command that starts ``launch``: confined by the first plugin that can, else as
        ``[sandbox] mode`` says (``required``: :class:`SandboxError`)."""
        if self.mode == "off":
            return unconfined(launch, 'none: [sandbox] mode = "off"')
        launch.read_only = [*launch.read_only, *self.read_only]
        launch.network = [*dict.fromkeys([*launch.network, *self.network])]
        launch.hide = [*launch.hide, *self.hidden_paths()]
        launch.open_egress = self._egress
        if self._mcp_socket is not None:
            launch.mcp_socket = await self._mcp_socket()
        if os.geteuid() == 0:
            launch.run_as = self.run_as
        result = self.plugins.sandbox_agent(launch) if self.plugins is not None else None
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, SandboxUnavailable) or result is None:
            why = result.reason if isinstance(result, SandboxUnavailable) else "no sandbox plugin can confine it"
            if self.mode == "required":
                raise SandboxError(
                    f'{launch.agent_id}: refusing to start the agent unconfined ([sandbox] mode = "required"): {why}'
                )
            if not self._warned:
                self._warned = True
                log.warning(
                    "AGENTS RUN UNCONFINED: %s; they can read and write whatever the gateway's user can and "
                    'reach any address ([sandbox] mode = "auto"; install bubblewrap, or set mode = "off" to '
                    "silence this)",
                    why,
                )
            result = unconfined(launch, f"none: {why}")
        self.confinements[launch.agent_id] = result.confinement
        return result


@dataclass
class SandboxUnavailable:
    """What a sandbox plugin returns when it handles launches but cannot confine this one here
    (e.g. bubblewrap missing or refused by the kernel); ``reason`` is one line."""

    reason: str


def unconfined(launch: AgentLaunch, why: str) -> SandboxedCommand:
    return SandboxedCommand(list(launch.command), dict(launch.env), str(launch.cwd), why, confined=False)


__all__ = [
    "MODES",
    "SECTION",
    "SECTION_DEFAULTS",
    "AgentLaunch",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "SandboxedCommand",
    "endpoint_of_url",
    "gateway_program_paths",
    "parse_endpoint",
    "program_paths",
    "safe_name",
    "validate_section",
    "write_home_file",
]
