"""The first process inside an agent's sandbox: its network, then the agent.

A sandboxed agent has a network namespace of its own: loopback only, nothing routed out. Before it
starts the agent, this supervisor listens inside on every loopback endpoint the agent may use and
relays each connection over a Unix socket the gateway bound into the sandbox:

- ``--forward 127.0.0.1:PORT=connect:HOST:PORT``: to the gateway's egress socket, opening with
  ``CONNECT HOST:PORT`` (the gateway checks its allow list and connects, or refuses);
- ``--forward 127.0.0.1:PORT=unix:PATH``: straight to a Unix socket (the gateway's MCP-only one);
- ``--proxy 127.0.0.1:PORT``: an HTTP proxy for ``HTTPS_PROXY``: bytes go as they are to the egress
  socket, whose CONNECT the client writes itself.

Then it runs the agent (through ``setpriv`` to another user when ``--run-as UID:GID`` is given),
passes SIGTERM/SIGINT/SIGHUP on, and exits with the agent's status. Only the standard library: it
runs with ``python -I -S`` and must start in a few milliseconds.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

CHUNK = 65536
HEAD_LIMIT = 8192


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _open_target(target: str) -> socket.socket:
    kind, _, rest = target.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(rest)
        return sock
    raise ValueError(target)


def _connect_via(egress: str, host_port: str) -> socket.socket:
    """A connection to ``host_port`` through the gateway's egress socket (CONNECT), or OSError."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(egress)
    sock.sendall(f"CONNECT {host_port} HTTP/1.1\r\nHost: {host_port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        if not data or len(head) > HEAD_LIMIT:
            sock.close()
            raise OSError(f"the gateway closed the connection to {host_port}")
        head += data
    status = head.split(b" ", 2)[1:2]
    if status != [b"200"]:
        sock.close()
        raise OSError(f"the gateway refused {host_port}: {head.splitlines()[0].decode(errors='replace')}")
    return sock


def _serve(listener: socket.socket, open_upstream: object) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return

        def handle(client: socket.socket = client) -> None:
            try:
                upstream = open_upstream()  # type: ignore[operator]
            except OSError:
                client.close()
                return
            _relay(client, upstream)

        threading.Thread(target=handle, daemon=True).start()


def _listen(address: str) -> list[socket.socket]:
    host, _, port = address.rpartition(":")
    sockets = []
    for family, bind_host in ((socket.AF_INET, host), (socket.AF_INET6, "::1")):
        if family == socket.AF_INET6 and host not in ("127.0.0.1", "localhost"):
            continue
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((bind_host if family == socket.AF_INET6 else "127.0.0.1", int(port)))
            sock.listen(64)
            sockets.append(sock)
        except OSError:
            if family == socket.AF_INET:
                raise
    return sockets


def _parse(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``--name value`` pairs up to ``--``, then the command. By hand: argparse alone would add a
    good part of the supervisor's start-up time to every agent's cold start."""
    options: dict[str, list[str]] = {"--egress": [], "--forward": [], "--proxy": [], "--run-as": []}
    index = 0
    while index < len(argv) and argv[index] != "--":
        name = argv[index]
        if name not in options or index + 1 >= len(argv):
            raise SystemExit(f"agent-gateway sandbox supervisor: bad argument {name!r}")
        options[name].append(argv[index + 1])
        index += 2
    return options, argv[index + 1 :]


def main(argv: list[str] | None = None) -> int:
    options, command = _parse(sys.argv[1:] if argv is None else argv)
    if not command:
        raise SystemExit("agent-gateway sandbox supervisor: no command")
    egress = options["--egress"][-1] if options["--egress"] else ""
    for spec in options["--forward"]:
        address, _, target = spec.partition("=")
        if target.startswith("connect:"):
            host_port = target[len("connect:") :]

            def opener(host_port: str = host_port) -> socket.socket:
                return _connect_via(egress, host_port)

        else:

            def opener(target: str = target) -> socket.socket:
                return _open_target(target)

        for listener in _listen(address):
            threading.Thread(target=_serve, args=(listener, opener), daemon=True).start()
    for address in options["--proxy"]:

        def proxy_opener() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(egress)
            return sock

        for listener in _listen(address):
            threading.Thread(target=_serve, args=(listener, proxy_opener), daemon=True).start()
    if options["--run-as"]:
        uid, _, gid = options["--run-as"][-1].partition(":")
        command = [
            "/usr/bin/setpriv",
            f"--reuid={uid}",
            f"--regid={gid or uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
            *command,
        ]
    pid = os.fork()
    if pid == 0:  # the agent: stdin, stdout and stderr are the supervisor's
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"agent-gateway sandbox: cannot start {command[0]}: {exc}\n".encode())
        os._exit(127)

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
