"""Helpers shared by the pipeline-fault, reconnect-storm, crash-harness and observability tests.

- :class:`ScriptRuntime` / :class:`ScriptPlugin`: a test runtime (agent id ``script``) that emits a
  run's events as its ``options`` say: N deltas (``message.delta`` or ``thought.delta``) with
  numbered text, non-delta kinds (tool / plan / session / permission) interleaved, optionally held
  at a gate before the burst or driven step by step from the test through a queue.
- :class:`BlockingStorage` / :class:`BlockingStoragePlugin`: the real peewee storage behind a
  wrapper whose ``append_events`` blocks while the test holds a ``threading.Event`` (or fails a few
  times), to prove delivery never waits on a database write.
- :class:`RawSseClient`: an SSE client on a raw socket with a tiny receive buffer that reads only
  when told to (a slow browser), and :class:`SseParser`, an incremental SSE parser.
- ``start_gateway_process``: ``python -m agent_gateway.cli serve`` through the suite's one starter
  (``tests._cli.launch``), for tests that SIGKILL or restart the gateway.

Every wait here is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.app import GATEWAY_KEY, Gateway
from agent_gateway.hookspecs import hookimpl
from agent_gateway.models import MERGEABLE_KINDS, TERMINAL_KINDS, Event
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.runtime import RuntimePolicy, Turn, TurnOutcome
from agent_gateway.testing.server import LoopThread as TestingLoopThread
from agent_gateway.testing.sse import SseEvent
from agent_gateway.testing.sse import SseParser as TestingSseParser
from agent_gateway.testing.sse import sse_events as testing_sse_events
from tests._cli import Served, launch

ROOT = Path(__file__).resolve().parent.parent
# contrib/ is never installed: the fake ACP agent runs as a script from the checkout.
FAKE_ACP_AGENT = str(ROOT / "contrib" / "fake_acp_agents" / "agent.py")
WAIT = 20.0
SCRIPT_AGENT = "script"

# The non-delta kinds the script runtime interleaves (none may be dropped or coalesced).
NON_DELTA_KINDS = (
    "tool.started",
    "tool.updated",
    "tool.completed",
    "plan.updated",
    "session.info.updated",
    "permission.requested",
    "permission.resolved",
)


def delta_text(index: int, chars: int) -> str:
    return f"<{index}>" + "x" * chars


# -- the script runtime ------------------------------------------------------------------------------


@dataclass
class Step:
    """One command for a stepped run: emit `deltas` deltas, then resolve `done`."""

    deltas: int
    done: asyncio.Future[None] | None = None


class ScriptRuntime:
    """Options (all optional): ``deltas`` (count), ``deltaKind``, ``every`` (a non-delta event after
    every N deltas; 0: none), ``chars`` (padding per delta), ``yieldEvery`` (let the loop run every N
    events), ``gate`` (wait for ``gates[name]`` before the burst, after a ``plan.updated``
    ``{"phase": "ready"}``), ``control`` (stepped: take :class:`Step` s from ``controls[name]``
    until None), ``hold`` (wait for ``gates[name]`` before returning), ``outcome``."""

    agent_id = SCRIPT_AGENT
    display_name = "Script (tests)"
    provider = "tests"

    def __init__(self) -> None:
        self.policy = RuntimePolicy(context_carrier="none")
        self.gates: dict[str, asyncio.Event] = {}
        self.controls: dict[str, asyncio.Queue[Step | None]] = {}

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    def control(self, name: str) -> asyncio.Queue[Step | None]:
        return self.controls.setdefault(name, asyncio.Queue())

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        options = turn.options
        kind = str(options.get("deltaKind", "message.delta"))
        every = int(options.get("every", 0))
        chars = int(options.get("chars", 8))
        yield_every = int(options.get("yieldEvery", 50))
        emitted = 0
        index = 0

        async def burst(count: int) -> None:
            nonlocal emitted, index
            for _ in range(count):
                await turn.emit(kind, {"text": delta_text(index, chars)})
                index += 1
                emitted += 1
                if every and index % every == 0:
                    other = NON_DELTA_KINDS[(index // every) % len(NON_DELTA_KINDS)]
                    await turn.emit(other, {"after": index, "toolCallId": f"call-{index}"})
                    emitted += 1
                if yield_every and emitted % yield_every == 0:
                    await asyncio.sleep(0)  # yield to the writers, as a real agent's reads would
                if turn.cancel_requested.is_set():
                    return

        if options.get("gate"):
            await turn.emit("plan.updated", {"phase": "ready"})
            await self._wait(self.gate(str(options["gate"])).wait(), turn)
        if options.get("control"):
            queue = self.control(str(options["control"]))
            while not turn.cancel_requested.is_set():
                step = await self._wait(queue.get(), turn)
                if step is None:
                    break
                await burst(step.deltas)
                if step.done is not None and not step.done.done():
                    step.done.set_result(None)
        else:
            await burst(int(options.get("deltas", 10)))
        if options.get("hold"):
            await self._wait(self.gate(str(options["hold"])).wait(), turn)
        if turn.cancel_requested.is_set():
            return TurnOutcome("cancelled", "cancelled by the client")
        status = str(options.get("outcome", "completed"))
        return TurnOutcome(status, None if status == "completed" else f"scripted {status}")

    @staticmethod
    async def _wait(awaitable: Any, turn: Turn) -> Any:
        """Await `awaitable` unless the run is cancelled first (then None)."""
        task = asyncio.ensure_future(awaitable)
        cancel = asyncio.ensure_future(turn.cancel_requested.wait())
        try:
            await asyncio.wait({task, cancel}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel.cancel()
        if task.done():
            return task.result()
        task.cancel()
        return None

    async def close(self) -> None:
        pass


class ScriptPlugin:
    def __init__(self) -> None:
        self.runtime = ScriptRuntime()

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(self.runtime)


def script_body(session: str, request_id: str, **options: Any) -> dict[str, Any]:
    return {
        "requestId": request_id,
        "agentId": SCRIPT_AGENT,
        "sessionId": session,
        "workspaceId": "local:test",
        "message": "run the script please",
        "options": options,
    }


# -- storage that blocks or fails ----------------------------------------------------------------------


class BlockingStorage:
    """The real storage, except that `append_events` waits while `held` and fails `fail_next`
    times. Counts the events it really wrote."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.open_gate = threading.Event()
        self.open_gate.set()
        self.blocked = threading.Event()  # set while a commit waits at the gate
        self.fail_next = 0
        self.failures = 0
        self.written = 0
        self._lock = threading.Lock()

    def hold(self) -> None:
        self.open_gate.clear()

    def release(self) -> None:
        self.open_gate.set()

    def append_events(self, events: Sequence[Event]) -> None:
        if not self.open_gate.is_set():
            self.blocked.set()
            # Bounded: a test that forgets to release fails instead of hanging.
            if not self.open_gate.wait(WAIT * 3):
                raise RuntimeError("BlockingStorage was never released")
            self.blocked.clear()
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                self.failures += 1
                raise OSError("simulated storage outage")
        self.inner.append_events(events)
        with self._lock:
            self.written += len(events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class BlockingStoragePlugin:
    def __init__(self) -> None:
        self.storage: BlockingStorage | None = None

    @hookimpl(tryfirst=True)
    def storage_backend(self, url: str, config: Any) -> Any:
        from agent_gateway.plugins.journal_peewee import storage_backend

        inner = storage_backend(url=url, config=config)
        if inner is None:
            return None
        self.storage = BlockingStorage(inner)
        return self.storage


# -- SSE parsing and a slow raw-socket client ----------------------------------------------------------


def as_dict(event: SseEvent) -> dict[str, Any]:
    """The tests' shape of an SSE frame: ``{"id", "event", "data"}``."""
    return {"id": event.id, "event": event.event, "data": event.data}


class SseParser:
    """Feed bytes, get ``{"id", "event", "data"}`` dicts (agent_gateway.testing's SseParser)."""

    def __init__(self) -> None:
        self._parser = TestingSseParser()

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        return [as_dict(event) for event in self._parser.feed(chunk)]


class RawSseClient:
    """GET a stream over a raw socket whose receive buffer is tiny; reads only when asked."""

    def __init__(
        self, host: str, port: int, path: str, headers: dict[str, str] | None = None, http_version: str = "1.1"
    ) -> None:
        self.host, self.port, self.path = host, port, path
        self.headers = headers or {}
        self.http_version = http_version
        self.events: list[dict[str, Any]] = []
        self.closed = False
        self._parser = SseParser()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._chunked = False
        self._body = b""
        self.body = bytearray()  # the de-chunked body as received

    async def connect(self, rcvbuf: int = 2048) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # no autotuning: a slow reader
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock, limit=4096)
        extra = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        request = (
            f"GET {self.path} HTTP/{self.http_version}\r\nHost: {self.host}:{self.port}\r\n"
            f"Accept: text/event-stream\r\n{extra}\r\n"
        )
        self._writer.write(request.encode())
        await self._writer.drain()
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        assert " 200 " in status_line + " ", status_line
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                self._chunked = True

    async def _read_body(self) -> bytes:
        """Next piece of the body (b"" at its end), de-chunked."""
        assert self._reader is not None
        if not self._chunked:
            return await self._reader.read(65536)
        size_line = await self._reader.readline()
        if not size_line:
            return b""
        size = int(size_line.strip().split(b";")[0], 16)
        if size == 0:
            await self._reader.readline()
            return b""
        data = await self._reader.readexactly(size)
        await self._reader.readexactly(2)
        return data

    async def read_until(self, predicate: Any, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Read until an event satisfies `predicate` (or the stream ends); return all events so far."""
        async with asyncio.timeout(timeout):
            while not self.closed:
                if any(predicate(e) for e in self.events):
                    break
                chunk = await self._read_body()
                if not chunk:
                    self.closed = True
                    break
                self.body += chunk
                self.events.extend(self._parser.feed(chunk))
        return self.events

    async def read_to_end(self, timeout: float = WAIT) -> list[dict[str, Any]]:
        return await self.read_until(lambda e: False, timeout)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


# -- checks ---------------------------------------------------------------------------------------------


def check_delivery(received: list[dict[str, Any]], journal: list[dict[str, Any]], after: int = 0) -> None:
    """`received` (SSE events of one stream resumed after `after`) is the journal after `after`, in
    order, except that runs of consecutive deltas may arrive merged (same text, `mergedFrom`);
    every non-delta event arrives exactly once, identical, and the terminal event is last."""
    by_seq = {int(e["seq"]): e for e in journal}
    expected = [e for e in journal if int(e["seq"]) > after]
    index_of = {int(e["seq"]): i for i, e in enumerate(expected)}
    seqs = [int(e["id"]) for e in received]
    assert seqs == sorted(set(seqs)), "seqs must strictly increase"
    position = 0  # index in `expected` of the next event not yet covered
    for event in received:
        seq = int(event["id"])
        data = event["data"]
        assert event["event"] == data["kind"]
        payload = data["payload"]
        if data["kind"] in MERGEABLE_KINDS and "mergedFrom" in payload:
            first = int(payload["mergedFrom"])
            covered = [by_seq[s] for s in range(first, seq + 1)]
            assert all(c["kind"] == data["kind"] for c in covered), f"merge {first}..{seq} spans other kinds"
            assert payload["text"] == "".join(c["payload"]["text"] for c in covered)
            assert int(payload["mergedCount"]) == len(covered)
            start = first
        else:
            assert data == by_seq[seq], f"event {seq} differs from the journal"
            start = seq
        assert position < len(expected), f"event {seq} after the end"
        assert int(expected[position]["seq"]) == start, f"gap before {start}: expected {expected[position]['seq']}"
        position = index_of[seq] + 1
    assert position == len(expected), f"stream ended after {position} of {len(expected)} events"
    if expected:
        assert received[-1]["event"] in TERMINAL_KINDS


def delta_text_of(events: list[dict[str, Any]], kind: str, wire: bool) -> str:
    """Concatenated text of `kind` deltas (`wire`: journal dicts; else SSE dicts)."""
    if wire:
        return "".join(e["payload"]["text"] for e in events if e["kind"] == kind)
    return "".join(e["data"]["payload"]["text"] for e in events if e["event"] == kind)


# -- prometheus text -------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_prometheus(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Parse Prometheus text exposition strictly: every sample has HELP and TYPE before it."""
    helps: set[str] = set()
    types: dict[str, str] = {}
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in helps, f"HELP twice for {name}"
            helps.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            types[name] = kind
            continue
        assert not line.startswith("#"), line
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels_text, value_text = match.groups()
        family = name
        for suffix in ("_bucket", "_sum", "_count"):  # a histogram's samples carry its family's HELP/TYPE
            if name.endswith(suffix) and types.get(name.removesuffix(suffix)) == "histogram":
                family = name.removesuffix(suffix)
        assert family in helps and family in types, f"{name} has no HELP/TYPE"
        labels: list[tuple[str, str]] = []
        if labels_text:
            inner = labels_text[1:-1]
            consumed = 0
            for label in _LABEL.finditer(inner):
                assert label.start() == consumed, f"bad labels {labels_text!r}"
                labels.append((label.group(1), label.group(2)))
                consumed = label.end()
            assert consumed == len(inner), f"bad labels {labels_text!r}"
        value = float(value_text)
        if types[family] == "counter":
            assert value >= 0
        key = tuple(sorted(labels))
        assert key not in samples.setdefault(name, {}), f"duplicate sample {line!r}"
        samples[name][key] = value
    return samples


def metric(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


# -- gateway processes -------------------------------------------------------------------------------------

# One starter for every gateway subprocess (tests/_cli.py); here the `python -m` form, from the checkout.
GatewayProcess = Served


async def start_gateway_process(
    data_dir: Path,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
    start_timeout: float = 30.0,
) -> Served:
    """`python -m agent_gateway.cli serve --port 0 --data-dir <data_dir> [args]`; stderr goes to
    `log_path`, stdout is drained after the listening line."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_GATEWAY")}
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full_env.update(env or {})
    argv = [sys.executable, "-m", "agent_gateway.cli", "serve", "--port", "0", "--data-dir", str(data_dir), *args]
    gateway = await launch(argv, env=full_env, cwd=ROOT, stderr_path=log_path, timeout=start_timeout)
    gateway.drain_stdout()
    return gateway


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def processes_tagged(tag: str) -> list[int]:
    """Processes whose environment holds `tag` (our agents, even once orphaned)."""
    found = []
    needle = tag.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ:
            found.append(int(entry))
    return found


def kill_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class LoopThread(TestingLoopThread):
    """agent_gateway.testing's LoopThread, for sync (hypothesis) tests driving async code."""

    def __init__(self) -> None:
        super().__init__("test-loop")

    def run(self, coro: Any, timeout: float = WAIT * 3) -> Any:
        return self.call(coro, timeout)

    def close(self) -> None:
        self.stop(WAIT)


# -- markers ------------------------------------------------------------------------------------------

# The test being set up or run (conftest's pytest_runtest_setup sets it): a helper that starts a real
# peer checks that the test carries the `peers` marker, so `-m "not peers"` never starts one.
current_item: pytest.Item | None = None


def require_mark(name: str, what: str) -> None:
    """Fail the current test unless it is marked `name` (registered in setup.cfg)."""
    item = current_item
    if item is not None and item.get_closest_marker(name) is None:
        pytest.fail(
            f"{item.nodeid} uses {what} but is not marked @pytest.mark.{name} (mark the test or its module)",
            pytrace=False,
        )


POSTGRES_URL = os.environ.get("AG_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


STORAGES = ("sqlite", "postgres")


MakeGateway = Callable[..., Awaitable[TestClient]]


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Parse an SSE response into ``{"id": str | None, "event": str, "data": Any}`` dicts
    (agent_gateway.testing's reader: ``data`` JSON-decoded, comments skipped) until it closes."""
    async for event in testing_sse_events(response):
        yield as_dict(event)


def stream_path(run_id: str, after: str | None = None) -> str:
    return f"/v1/runs/{run_id}/stream" + (f"?afterSeq={after}" if after is not None else "")


async def read_stream(
    client: TestClient,
    run_id: str,
    *,
    after: str | None = None,
    last_event_id: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = WAIT,
) -> list[dict[str, Any]]:
    """Every SSE event of one stream request, until the server closes it (bounded by timeout)."""
    all_headers = dict(headers or {})
    if last_event_id is not None:
        all_headers["Last-Event-ID"] = last_event_id
    events = []
    async with asyncio.timeout(timeout):
        async with client.get(stream_path(run_id, after), headers=all_headers) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "text/event-stream"
            async for event in sse_events(response):
                events.append(event)
    return events


async def run_to_end(
    client: TestClient,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    timeout: float = WAIT,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """POST a run, stream it until its terminal event; return (creation receipt, SSE events).

    Asserts the stream ends with exactly one terminal event and closes after it."""
    response = await client.post("/v1/runs", json=body, headers=headers or {})
    assert response.status in (200, 201), await response.text()
    receipt = await response.json()
    events = await read_stream(client, receipt["hostRunId"], headers=headers, timeout=timeout)
    assert events, "the stream closed without any event"
    assert events[-1]["event"] in TERMINAL_KINDS, [e["event"] for e in events]
    assert sum(e["event"] in TERMINAL_KINDS for e in events) == 1
    return receipt, events


async def events_page(
    client: TestClient, run_id: str, headers: dict[str, str] | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    """Every event of a run through `GET /events`, following nextCursor."""
    out: list[dict[str, Any]] = []
    cursor = "0"
    while True:
        response = await client.get(
            f"/v1/runs/{run_id}/events", params={"afterSeq": cursor, "limit": str(limit)}, headers=headers or {}
        )
        assert response.status == 200, await response.text()
        page = await response.json()
        out.extend(page["events"])
        if not page["events"]:
            return out
        cursor = page["nextCursor"]


def run_body(message: str = "hello", **fields: Any) -> dict[str, Any]:
    """A valid chat-only run body with a fresh requestId and sessionId (override any field)."""
    body: dict[str, Any] = {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": "chat-only",
        "sessionId": "s-" + uuid.uuid4().hex[:10],
        "workspaceId": "local:test",
        "message": message,
    }
    body.update(fields)
    return body


def gateway_of(client: TestClient) -> Gateway:
    return client.app[GATEWAY_KEY]  # type: ignore[index]


def postgres_url_for_schema(schema: str) -> str:
    """The storage URL whose connections use `schema` as their search_path."""
    joiner = "&" if "?" in POSTGRES_URL else "?"
    return f"{POSTGRES_URL}{joiner}options=-csearch_path%3D{schema}"


@pytest.fixture(name="storage")
def storage_fixture(storage_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PeeweeStorage]:
    """An opened PeeweeStorage on SQLite or on PostgreSQL (a schema of its own, dropped after)."""
    if storage_kind == "sqlite":
        store = PeeweeStorage(f"sqlite:///{tmp_path / 'gateway.db'}")
        store.open()
        yield store
        store.close()
        return
    admin = request.getfixturevalue("postgres_admin")
    schema = f"ag_compact_{uuid.uuid4().hex[:10]}"
    store = PeeweeStorage(POSTGRES_URL, schema=schema)
    store.open()
    try:
        yield store
    finally:
        store.close()
        with admin.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
