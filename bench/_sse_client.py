"""Cheap SSE clients for the benchmarks, run in their own process (so they are not the bottleneck).

    python bench/_sse_client.py '<json spec>'
    python bench/_sse_client.py -    (prints `waiting`, then reads the spec as one line on stdin)

The spec: {"url", "streams": [{"run": id, "after": "000…"|null}, …], "mode": "count"|"latency"|"text",
"rcvbuf": bytes|null, "slow_rate": events/s|null, "slow_until_file": path|null}.

Each stream is one HTTP/1.1 connection handled by a bare asyncio BufferedProtocol (no StreamReader,
no task and no bytes object per read): `count` counts events by their `data:` lines with `bytes.count`
and looks for the terminal event only in a chunk's tail (it is the last event of a stream);
`latency` reads the `"t":` stamp of every event (CLOCK_MONOTONIC of the gateway's emit, system-wide
on Linux) and subtracts it from the arrival time; `text` parses every event and reassembles the
`message.delta` text. A `slow_rate` stream reads about one event's worth of bytes at that rate (the
transport paused in between) until the file `slow_until_file` exists, then at full speed. A stream
the gateway closes before the terminal event reconnects with `Last-Event-ID`, as a browser does.

Prints `ready` once every connection has its response headers, then one JSON line: a result per
stream and the process's CPU time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import socket
import sys
import time
from typing import Any
from urllib.parse import urlsplit

TERMINALS = (b"event: run.completed", b"event: run.failed", b"event: run.cancelled", b"event: run.interrupted")
STAMP = re.compile(rb'"t":([0-9.]+)')
ID_LINE = b"\nid: "  # every frame's first line follows the previous frame's blank line or a chunk header
# Counted in `count` mode: every event frame has one such line, and a long needle is searched
# about twice as fast as `ID_LINE` (the clients share the machine's two cores with the gateway).
DATA_LINE = b'\ndata: {"schema":"gateway.run_event.v1"'
OVERLAP = len(DATA_LINE) - 1
SLOW_READ_BYTES = 240  # about one SSE frame of a 16-character delta


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Stream(asyncio.BufferedProtocol):
    def __init__(self, spec: dict[str, Any], stream: dict[str, Any]) -> None:
        self.spec = spec
        self.run = stream["run"]
        self.mode = spec.get("mode", "count")
        self.slow_rate = spec.get("slow_rate")
        self.slow_until = spec.get("slow_until_file")
        self.events = 0
        self.bytes = 0
        self.connected_at = 0.0
        self.first_event_at: float | None = None
        self.done_at: float | None = None
        self.latencies: list[float] = []
        self.text: list[str] = []
        self.last_id: str | None = stream.get("after")
        self.reconnects = 0
        self.error: str | None = None
        self.terminal = False
        self.transport: Any = None
        self.headers_done = False
        self.head = b""
        self.carry = b""
        self.ready: asyncio.Future[None] | None = None
        self.closed: asyncio.Future[None] | None = None
        self.slow_start = 0.0
        self.slow_reads = 0
        self.buffer = bytearray(256 * 1024)
        self.view = memoryview(self.buffer)

    # -- connection ---------------------------------------------------------------------------------
    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        parts = urlsplit(self.spec["url"])
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if self.spec.get("rcvbuf"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(self.spec["rcvbuf"]))
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        self.ready, self.closed = loop.create_future(), loop.create_future()
        self.headers_done, self.head, self.carry = False, b"", b""
        self.connected_at = time.monotonic()
        await loop.create_connection(lambda: self, sock=sock)
        request = f"GET /v1/runs/{self.run}/stream HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
        if self.last_id:
            request += f"Last-Event-ID: {self.last_id}\r\n"
        self.transport.write((request + "\r\n").encode())
        await self.ready

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.slow_rate:
            self.slow_start = time.monotonic()
            self.slow_reads = 0

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ready is not None and not self.ready.done():
            self.ready.set_exception(exc or ConnectionError("closed before the response headers"))
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    async def follow(self) -> None:
        try:
            while True:
                assert self.closed is not None
                await self.closed
                if self.terminal:
                    break
                self.reconnects += 1  # the gateway gave up on us (send timeout): resume
                await self.connect()
        except Exception as exc:  # reported, not raised: the benchmark counts errors
            self.error = f"{type(exc).__name__}: {exc}"
        self.done_at = self.done_at or time.monotonic()

    # -- data -----------------------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view if not self.slow_rate else self.view[:SLOW_READ_BYTES]

    def buffer_updated(self, nbytes: int) -> None:
        if self.mode == "count" and self.headers_done and not self.slow_rate:
            self._count_buffer(nbytes)  # no bytes object per read: count in the receive buffer
            if self.terminal:
                self.done_at = time.monotonic()
                self.transport.close()
            return
        self.data_received(bytes(self.buffer[:nbytes]))

    def _count_buffer(self, nbytes: int) -> None:
        buffer = self.buffer
        head = bytes(buffer[: min(OVERLAP, nbytes)])
        found = buffer.count(DATA_LINE, 0, nbytes) + (self.carry + head).count(DATA_LINE)  # + one straddling
        self.bytes += nbytes
        if found:
            self.events += found
            if self.first_event_at is None:
                self.first_event_at = time.monotonic()
        if nbytes < OVERLAP:
            self.carry = (self.carry + head)[-OVERLAP:]
        else:
            self.carry = bytes(buffer[nbytes - OVERLAP : nbytes])
        tail = bytes(buffer[max(0, nbytes - 1024) : nbytes])
        if b"event: run." in tail and any(t in tail for t in TERMINALS):
            self.terminal = True

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.headers_done:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self.head.split(b"\r\n", 1)[0]
            if not status.startswith(b"HTTP/1.1 200"):
                assert self.ready is not None
                self.ready.set_exception(RuntimeError(status.decode()))
                self.transport.close()
                return
            self.headers_done = True
            data, self.head = self.head[end + 2 :], b""  # keep the CRLF: the first chunk header follows it
            assert self.ready is not None
            self.ready.set_result(None)
        if self.slow_rate:
            self._pace()
        self.bytes += len(data)
        if self.mode == "count":
            self._count(data, now)
        else:
            self._parse(data, now)
        if self.terminal:
            self.done_at = now
            self.transport.close()

    def _count(self, data: bytes, now: float) -> None:
        found = data.count(DATA_LINE) + (self.carry + data[:OVERLAP]).count(DATA_LINE)
        if found:
            self.events += found
            if self.first_event_at is None:
                self.first_event_at = now
        self.carry = (self.carry + data)[-OVERLAP:]
        tail = data[-1024:]
        if b"event: run." in tail and any(t in tail for t in TERMINALS):
            self.terminal = True

    def _parse(self, data: bytes, now: float) -> None:
        data = self.carry + data
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self.carry = data
            return
        # Keep the blank line's last newline with the rest, so every frame's `id:` line follows a
        # newline in the part it is counted in.
        frames, self.carry = data[: cut + 1], data[cut + 1 :]
        found = frames.count(ID_LINE)
        if not found:
            return
        if self.first_event_at is None:
            self.first_event_at = now
        self.events += found
        start = frames.rfind(ID_LINE) + len(ID_LINE)
        self.last_id = frames[start : frames.index(b"\n", start)].decode()
        if self.mode == "latency":
            self.latencies.extend([now - float(t) for t in STAMP.findall(frames)])
        else:
            for line in frames.split(b"\n"):
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if event["kind"] == "message.delta":
                        self.text.append(event["payload"]["text"])
        tail = frames[-1024:]
        if b"event: run." in tail and any(t in tail for t in TERMINALS):
            self.terminal = True

    def _pace(self) -> None:
        if self.slow_until and os.path.exists(self.slow_until):
            self.slow_rate = None
            return
        self.slow_reads += 1
        delay = self.slow_start + self.slow_reads / self.slow_rate - time.monotonic()
        if delay > 0:
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(delay, self._resume)

    def _resume(self) -> None:
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run,
            "events": self.events,
            "bytes": self.bytes,
            "terminal": self.terminal,
            "error": self.error,
            "reconnects": self.reconnects,
            "connected_at": self.connected_at,
            "first_event_at": self.first_event_at,
            "done_at": self.done_at,
        }
        if self.mode == "latency":
            out["latencies"] = [round(x * 1000, 3) for x in self.latencies]
        if self.mode == "text":
            out["text"] = "".join(self.text)
        return out


async def main(spec: dict[str, Any]) -> None:
    _raise_fd_limit()
    streams = [Stream(spec, s) for s in spec["streams"]]
    followers = []
    for i in range(0, len(streams), 100):  # a hundred at a time, not a SYN flood
        batch = streams[i : i + 100]
        outcomes = await asyncio.gather(*(s.connect() for s in batch), return_exceptions=True)
        for stream, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                stream.error = f"{type(outcome).__name__}: {outcome}"
            else:
                followers.append(stream.follow())
    print("ready", flush=True)
    await asyncio.gather(*followers)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"streams": [s.result() for s in streams], "cpu": [usage.ru_utime, usage.ru_stime]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "-":  # started ahead: the spec comes when the run it measures does
        print("waiting", flush=True)
        asyncio.run(main(json.loads(sys.stdin.readline())))
    else:
        asyncio.run(main(json.loads(sys.argv[1])))
