"""The built-in sandbox: bubblewrap (``bwrap``), ``trylast`` so a plugin can replace it.

What an agent sees inside (everything else of the host does not exist there):

- the system read-only: ``/usr``, ``/bin``, ``/lib*``, ``/sbin`` and a short list of ``/etc`` files
  (certificates, resolver, users, time zone, linker cache), never ``/etc`` whole;
- its own install and interpreter, the gateway's interpreter and package (for the MCP stdio bridge
  and the network supervisor), and ``[sandbox] read_only``, all read-only;
- its per-actor home, read-write; a private ``/tmp``; ``/dev`` with the usual pseudo-devices;
- the run's workspace folder holding only the run's allowed roots, each read-write at its place
  (a run with no allowed roots sees an empty workspace folder);
- ``/proc`` of its own PID namespace (its own processes only); its own IPC and UTS namespaces;
- no network but loopback: the supervisor (:mod:`agent_gateway.sandbox.supervisor`) relays the
  allowed endpoints through the gateway's egress socket and the gateway URL to the MCP-only socket.

The gateway's data directory, config file and ``[sandbox] hide`` are covered with an empty
folder (or ``/dev/null``) wherever they fall inside something bound. Where the gateway runs as
root, the agent runs as ``[sandbox] run_as`` (``nobody`` by default) with no capabilities and
``no_new_privs``; otherwise as the gateway's user inside a user namespace.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path

from agent_gateway.hookspecs import hookimpl
from agent_gateway.sandbox import (
    SANDBOX_RUN_DIR,
    SYSTEM_DIRS,
    SYSTEM_ETC,
    AgentLaunch,
    SandboxedCommand,
    SandboxUnavailable,
    endpoint_of_url,
    gateway_program_paths,
)

# The port an agent finds the gateway's MCP surface on inside, when the gateway's own port is
# privileged or unknown.
INSIDE_MCP_PORT = 18787
INSIDE_PROXY_PORT = 3128
PROBE_TIMEOUT = 5.0

_probe_lock = threading.Lock()
_probe_result: list[str | None] = []


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def probe() -> str | None:
    """None when bubblewrap can build this sandbox here; otherwise why not (one line). Run once."""
    with _probe_lock:
        if _probe_result:
            return _probe_result[0]
        _probe_result.append(_probe())
        return _probe_result[0]


def _probe() -> str | None:
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if os.geteuid() == 0 and not os.path.exists("/usr/bin/setpriv"):
        return "setpriv (util-linux) is missing: agents cannot be made to run as another user than root"
    argv = [bwrap, *_namespace_args(), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not run: {exc}"
    if done.returncode != 0:
        why = " ".join(done.stderr.decode("utf-8", "replace").split())[:300] or f"exit {done.returncode}"
        return f"bubblewrap cannot create namespaces here: {why}"
    return None


def _namespace_args() -> list[str]:
    args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try"]
    if os.geteuid() != 0:
        args.append("--unshare-user")
    return args


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


class _Args:
    """bwrap arguments, creating each destination's missing parents as 0755 folders once."""

    def __init__(self) -> None:
        self.argv: list[str] = []
        self._dirs: set[str] = {"/"}
        self.bound: list[str] = []

    def parents(self, path: str) -> None:
        missing = []
        parent = os.path.dirname(path)
        while parent not in self._dirs:
            missing.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(missing):
            self.argv += ["--perms", "0755", "--dir", directory]
            self._dirs.add(directory)

    def dir(self, path: str) -> None:
        self.parents(path)
        if path not in self._dirs:
            self.argv += ["--perms", "0755", "--dir", path]
            self._dirs.add(path)

    def bind(self, source: str, dest: str, *, writable: bool) -> None:
        self.parents(dest)
        self.argv += ["--bind" if writable else "--ro-bind", source, dest]
        self._dirs.add(dest)
        self.bound.append(dest)


def build_argv(launch: AgentLaunch, egress_dir: Path | None) -> tuple[list[str], dict[str, str], str | None]:
    """The bwrap command line for ``launch``, the agent's environment inside and the MCP base URL
    it calls back on (None: no MCP)."""
    bwrap = bwrap_path() or "bwrap"
    args = _Args()
    args.argv += [bwrap, "--die-with-parent", "--new-session", *_namespace_args(), "--hostname", "agent"]
    # A private /tmp anyone inside may write (the agent may run as another user than bwrap).
    args.argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    args._dirs.update({"/proc", "/dev", "/tmp"})
    for directory in SYSTEM_DIRS:
        if os.path.islink(directory):
            args.argv += ["--symlink", os.readlink(directory), directory]
            args._dirs.add(directory)
        elif os.path.isdir(directory):
            args.bind(directory, directory, writable=False)
    args.dir("/etc")
    for name in SYSTEM_ETC:
        path = os.path.join("/etc", name)
        if os.path.exists(path):
            args.bind(os.path.realpath(path), path, writable=False)
    args.parents("/var/tmp")
    args.argv += ["--perms", "1777", "--tmpfs", "/var/tmp"]
    read_only = [os.path.realpath(p) for p in [*launch.read_only, *gateway_program_paths()] if p.exists()]
    # Shallow paths first, so a deeper bind (a home inside an install) lands on top.
    for path in sorted(dict.fromkeys(read_only), key=lambda p: p.count("/")):
        if any(_inside(path, system) for system in SYSTEM_DIRS):
            continue
        args.bind(path, path, writable=False)
    # Never the gateway's data, config or what the operator hides, even inside something bound
    # read-only; the home and workspace roots are mounted after, on top.
    for hidden in launch.hide:
        path = str(hidden)
        if any(_inside(path, bound) for bound in args.bound) and os.path.exists(path):
            if os.path.isdir(path):
                args.argv += ["--tmpfs", path]
            else:
                args.argv += ["--ro-bind", "/dev/null", path]
    # The paths the agent is told (home, workspace) as given; their contents from the real folders.
    home = str(launch.home)
    args.bind(os.path.realpath(home), home, writable=True)
    workspace = str(launch.workspace_dir)
    if not _inside(workspace, home):
        args.dir(workspace)
    for source, dest in sorted(launch.writable, key=lambda pair: str(pair[1]).count("/")):
        args.bind(os.path.realpath(source), str(dest), writable=True)
    cwd = str(launch.cwd)
    if not any(_inside(cwd, bound) for bound in args.bound):
        args.dir(cwd)
    env = dict(launch.env)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
        env.pop(name.lower(), None)
    env["HOME"] = home
    env["TMPDIR"] = "/tmp"
    supervisor = [os.path.realpath(sys.executable), "-I", "-S", str(Path(__file__).with_name("supervisor.py"))]
    forwards: list[str] = []
    mcp_base_url: str | None = None
    if egress_dir is not None:
        args.dir(SANDBOX_RUN_DIR)
        args.bind(str(egress_dir), f"{SANDBOX_RUN_DIR}/net", writable=False)
        supervisor += ["--egress", f"{SANDBOX_RUN_DIR}/net/egress.sock"]
    used_ports: set[int] = set()
    mcp_endpoint = endpoint_of_url(launch.mcp_url) if launch.mcp_url else None
    if launch.mcp_socket is not None and mcp_endpoint is not None:
        args.bind(str(launch.mcp_socket.parent), f"{SANDBOX_RUN_DIR}/mcp", writable=False)
        port = mcp_endpoint[1] if _is_loopback(mcp_endpoint[0]) and mcp_endpoint[1] >= 1024 else INSIDE_MCP_PORT
        forwards.append(f"127.0.0.1:{port}=unix:{SANDBOX_RUN_DIR}/mcp/mcp.sock")
        used_ports.add(port)
        mcp_base_url = f"http://127.0.0.1:{port}"
    remote = False
    for host, port in launch.network:
        if _is_loopback(host):
            if port not in used_ports and egress_dir is not None:
                forwards.append(f"127.0.0.1:{port}=connect:{host}:{port}")
                used_ports.add(port)
        else:
            remote = True
    for spec in forwards:
        supervisor += ["--forward", spec]
    if remote and egress_dir is not None:
        proxy_port = INSIDE_PROXY_PORT if INSIDE_PROXY_PORT not in used_ports else INSIDE_MCP_PORT + 1
        supervisor += ["--proxy", f"127.0.0.1:{proxy_port}"]
        proxy = f"http://127.0.0.1:{proxy_port}"
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            env[name] = proxy
        env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    if launch.run_as is not None:
        supervisor += ["--run-as", f"{launch.run_as[0]}:{launch.run_as[1]}"]
    args.argv += ["--chdir", cwd, "--", *supervisor, "--", *launch.command]
    return args.argv, env, mcp_base_url


def describe(launch: AgentLaunch) -> str:
    user = f"uid {launch.run_as[0]}" if launch.run_as is not None else "the gateway's user in a user namespace"
    reach = ", ".join(f"{h}:{p}" for h, p in launch.network) or "nothing"
    return (
        f"bubblewrap: own pid/ipc/uts/net namespaces, as {user}; sees its home, "
        f"{len(launch.writable)} writable root(s), read-only system and install; reaches {reach} and the MCP surface"
    )


async def _confine(launch: AgentLaunch) -> SandboxedCommand:
    egress = await launch.open_egress(launch.network) if launch.open_egress is not None else None
    argv, env, mcp_base_url = build_argv(launch, egress.directory if egress is not None else None)
    return SandboxedCommand(
        argv,
        env,
        str(launch.cwd),
        describe(launch),
        mcp_base_url=mcp_base_url,
        cleanup=egress.close if egress is not None else None,
    )


@hookimpl(trylast=True)
def sandbox_agent(launch: AgentLaunch) -> Awaitable[SandboxedCommand] | SandboxUnavailable:
    """Confine every agent with bubblewrap where it works here; say why not otherwise."""
    why = probe()
    if why is not None:
        return SandboxUnavailable(why)
    return _confine(launch)
