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
passes SIGTERM/SIGINT/SIGHUP on, and exits with the agent's status. It starts on every agent's
cold start, so it runs with ``python -I -S`` and imports only the interpreter's C modules
(``_socket``, ``_thread``, ``_signal``): the ``socket``, ``threading`` and ``signal`` modules
would pull in ``enum`` and ``selectors`` and double its start-up. The listening sockets are bound
before the agent starts (a connection queues until it is accepted); the threads that accept them
start after.
"""

from __future__ import annotations

import _signal
import _socket
import _thread
import os
import sys

CHUNK = 65536
HEAD_LIMIT = 8192
SHUT_RD, SHUT_WR = 0, 1
Socket = _socket.socket


def _pump(source: Socket, sink: Socket, done: _thread.LockType | None = None) -> None:
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, SHUT_WR), (source, SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass
        if done is not None:
            done.release()


def _relay(client: Socket, upstream: Socket) -> None:
    back = _thread.allocate_lock()
    back.acquire()
    _thread.start_new_thread(_pump, (upstream, client, back))
    _pump(client, upstream)
    back.acquire()  # the other direction has ended too
    client.close()
    upstream.close()


def _unix(path: str) -> Socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _connect_via(egress: str, host_port: str) -> Socket:
    """A connection to ``host_port`` through the gateway's egress socket (CONNECT), or OSError."""
    sock = _unix(egress)
    sock.sendall(f"CONNECT {host_port} HTTP/1.1\r\nHost: {host_port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(1)
        if not data or len(head) > HEAD_LIMIT:
            sock.close()
            raise OSError(f"the gateway closed the connection to {host_port}")
        head += data
    if head.split(b" ", 2)[1:2] != [b"200"]:
        sock.close()
        raise OSError(f"the gateway refused {host_port}: {head.splitlines()[0].decode(errors='replace')}")
    return sock


def _handle(client: Socket, open_upstream: object) -> None:
    try:
        upstream = open_upstream()  # type: ignore[operator]
    except OSError:
        client.close()
        return
    _relay(client, upstream)


def _serve(listener: Socket, open_upstream: object) -> None:
    while True:
        try:
            fd, _ = listener._accept()
        except OSError:
            return
        _thread.start_new_thread(_handle, (_socket.socket(fileno=fd), open_upstream))


def _listen(address: str) -> list[Socket]:
    """Listening sockets on loopback inside the sandbox: 127.0.0.1 and, where it exists, ::1."""
    port = int(address.rpartition(":")[2])
    sockets = []
    for family, host in ((_socket.AF_INET, "127.0.0.1"), (_socket.AF_INET6, "::1")):
        sock = _socket.socket(family, _socket.SOCK_STREAM)
        try:
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            if family == _socket.AF_INET6:
                sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 1)
            sock.bind((host, port))
            sock.listen(64)
        except OSError:
            sock.close()
            if family == _socket.AF_INET:
                raise
            continue
        sockets.append(sock)
    return sockets


def _parse(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``--name value`` pairs up to ``--``, then the command (by hand: argparse would add a good
    part of the supervisor's start-up to every agent's cold start)."""
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
    served: list[tuple[Socket, object]] = []
    for spec in options["--forward"]:
        address, _, target = spec.partition("=")
        kind, _, rest = target.partition(":")
        if kind == "connect":

            def opener(host_port: str = rest) -> Socket:
                return _connect_via(egress, host_port)

        elif kind == "unix":

            def opener(path: str = rest) -> Socket:
                return _unix(path)

        else:
            raise SystemExit(f"agent-gateway sandbox supervisor: bad forward {spec!r}")
        served.extend((listener, opener) for listener in _listen(address))
    for address in options["--proxy"]:

        def proxy_opener() -> Socket:
            return _unix(egress)

        served.extend((listener, proxy_opener) for listener in _listen(address))
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
        for listener, _ in served:
            listener.close()
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

    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, forward)
    for listener, opener in served:
        _thread.start_new_thread(_serve, (listener, opener))
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
