"""The stdio MCP bridge: newline-delimited JSON-RPC on stdin/stdout ⇄ ``POST /v1/mcp``.

Agents that only speak stdio MCP (any ACP agent without ``mcpCapabilities.http``)
start it as their MCP server::

    AGENT_GATEWAY_MCP_TOKEN=<lease token> python -m agent_gateway.mcp.bridge --url http://127.0.0.1:8787
    AGENT_GATEWAY_MCP_TOKEN=<lease token> agent-gateway mcp-bridge --url http://127.0.0.1:8787

The token is read from an environment variable (``--token-env``), never from argv, so it does not
show in ``ps``. Each line read is POSTed as is; each answer is written back as one line (compact
JSON, so a newline inside a string can never split it). Requests are relayed concurrently (a
``ping`` is not stuck behind a long tool call); the ``Mcp-Session-Id`` given on ``initialize`` is
sent with every later request. When the gateway cannot be reached, times out or answers something
that is not JSON-RPC, every request gets a JSON-RPC error saying so — never silence. The bridge
exits when stdin closes, after the requests in flight are answered (each is bounded by
``--timeout``).

Only the standard library and click are used: the bridge starts for every agent session and must
start fast and not depend on the gateway's plugins.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import click

from agent_gateway.mcp import MCP_PATH, TOKEN_ENV

DEFAULT_TIMEOUT = 600.0
MAX_WORKERS = 8
SESSION_HEADER = "Mcp-Session-Id"
# JSON-RPC codes this bridge answers with itself.
GATEWAY_UNREACHABLE = -32000
UNAUTHORIZED = -32001
PARSE_ERROR = -32700


def endpoint_of(url: str) -> str:
    """``http://host:port`` → ``http://host:port/v1/mcp`` (a URL already ending in it is kept)."""
    url = url.rstrip("/")
    return url if url.endswith(MCP_PATH) else url + MCP_PATH


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _ids(message: Any) -> list[Any]:
    items = message if isinstance(message, list) else [message]
    return [m.get("id") for m in items if isinstance(m, dict) and "method" in m and m.get("id") is not None]


def _errors_for(message: Any, code: int, text: str) -> Any:
    """One JSON-RPC error per request in ``message``; None when it holds only notifications."""
    errors = [{"jsonrpc": "2.0", "id": i, "error": {"code": code, "message": text}} for i in _ids(message)]
    if not errors:
        return None
    return errors if isinstance(message, list) else errors[0]


def _is_jsonrpc(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, dict) and v.get("jsonrpc") == "2.0" for v in value)
    return isinstance(value, dict) and value.get("jsonrpc") == "2.0"


class Bridge:
    def __init__(self, url: str, token: str, stdout: BinaryIO, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoint = endpoint_of(url)
        self.token = token
        self.stdout = stdout
        self.timeout = timeout
        self.session_id: str | None = None
        self._write_lock = threading.Lock()
        # No proxies: the gateway is reached directly (an HTTP(S)_PROXY in the agent's environment
        # must not route tool calls, and their token, elsewhere).
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.broken_pipe = threading.Event()

    def write(self, value: Any) -> None:
        with self._write_lock:
            try:
                self.stdout.write(_dumps(value) + b"\n")
                self.stdout.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.broken_pipe.set()

    def handle_line(self, line: bytes) -> None:
        """Relay one line; write the answer (if any). Never raises."""
        try:
            message = json.loads(line)
        except ValueError as exc:
            self.write(
                {"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": f"invalid JSON: {exc}"}}
            )
            return
        try:
            answer = self.post(line, message)
        except Exception as exc:  # a bug here must still answer, not leave the client waiting
            answer = _errors_for(message, GATEWAY_UNREACHABLE, f"the MCP bridge failed: {type(exc).__name__}: {exc}")
        if answer is not None:
            self.write(answer)

    def post(self, body: bytes, message: Any) -> Any:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {self.token}",
        }
        if self.session_id is not None:
            headers[SESSION_HEADER] = self.session_id
        request = urllib.request.Request(self.endpoint, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                status = response.status
                data = response.read()
                session_id = response.headers.get(SESSION_HEADER)
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                data = exc.read()
            except OSError:
                data = b""
            session_id = None
            exc.close()
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            return _errors_for(
                message,
                GATEWAY_UNREACHABLE,
                f"cannot reach the agent gateway at {self.endpoint}: {reason}",
            )
        if session_id:
            self.session_id = session_id
        if status == 404 and self.session_id is not None:
            self.session_id = None  # the gateway forgot our session: the client must initialize again
        if status == 202 or (not data.strip() and status < 400):
            return None
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if _is_jsonrpc(answer):
            return answer
        snippet = data[:200].decode("utf-8", "replace").strip()
        code = UNAUTHORIZED if status in (401, 403) else GATEWAY_UNREACHABLE
        return _errors_for(message, code, f"the agent gateway answered HTTP {status}: {snippet or '(empty body)'}")


def run_bridge(
    url: str,
    token: str,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
) -> int:
    """Relay until stdin closes; returns the exit status."""
    source = stdin if stdin is not None else sys.stdin.buffer
    bridge = Bridge(url, token, stdout if stdout is not None else sys.stdout.buffer, timeout=timeout)
    with ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="mcp-bridge") as pool:
        for raw in iter(source.readline, b""):
            if bridge.broken_pipe.is_set():
                break
            line = raw.strip()
            if line:
                pool.submit(bridge.handle_line, line)
    return 0


@click.command("mcp-bridge")
@click.option(
    "--url",
    required=True,
    help="The gateway's base URL (e.g. http://127.0.0.1:8787), or its full /v1/mcp URL.",
)
@click.option(
    "--token-env",
    default=TOKEN_ENV,
    show_default=True,
    help="The environment variable holding the MCP lease token (never pass a token in argv).",
)
@click.option(
    "--timeout",
    type=float,
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for the gateway's answer to one message.",
)
def mcp_bridge(url: str, token_env: str, timeout: float) -> None:
    """Serve the gateway's tools as a stdio MCP server (relays to POST /v1/mcp)."""
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise click.UsageError(f"the environment variable {token_env} (the MCP lease token) is not set")
    try:
        status = run_bridge(url, token, timeout=timeout)
    except KeyboardInterrupt:
        status = 130
    sys.exit(status)


def add_commands(cli: click.Group) -> None:
    """Register ``mcp-bridge`` on the ``agent-gateway`` click group."""
    cli.add_command(mcp_bridge)


if __name__ == "__main__":
    mcp_bridge()
