"""A fast ACP agent for the benchmarks: a raw stdio JSON-RPC writer (not the SDK).

    python bench/_fast_acp_agent.py [--mode block|line|encode] [--rate R]  # an ACP agent on stdin/stdout
    python bench/_fast_acp_agent.py --standalone 200000 [--mode M] [--rate R]  # print its own rate, exit

As an agent it answers ``initialize`` (no ``loadSession``), ``session/new`` and ``session/prompt``;
any other request gets ``-32601``, notifications (``session/cancel``) are ignored. The first
integer in the prompt's text is N (default 20,000): the agent writes N ``session/update``
``agent_message_chunk`` lines (each the text ``"x"``) as fast as it can, then the prompt's response
(``stopReason: end_turn``). Only the write blocks when the reader is behind (the pipe is full), as
for any agent. ``--mode``: ``block`` (default) writes the pre-encoded line in blocks of
``BLOCK_LINES``; ``line`` writes it once per chunk (an agent that sends each chunk as it has it);
``encode`` also encodes every chunk with ``json.dumps`` (a real agent's own per-chunk work).
``--rate R`` (``line`` and ``encode``) writes no faster than R messages a second: chunk i is due
at i / R seconds after the first, waited for on the clock (a busy wait: no sleep is that fine), and
written at once when the agent is late. An agent at about the gateway's own pace is the hard case:
the gateway's reads then hold a few messages each, rarely a backlog.

``--standalone N`` writes N chunk lines through a pipe to a thread that drains it in large reads
(``bytes.count`` in C: the reader is not the limit) and prints the lines per second, to show that
the agent is faster than any client measured against it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from typing import Any

DEFAULT_CHUNKS = 20_000
BLOCK_LINES = 256  # ~33 KB a write: an agent that streams, not one that writes its turn in one go
NUMBER = re.compile(r"\d+")


def chunk_line(session_id: str, text: str = "x") -> bytes:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    message = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": update}}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def write_chunks(fd: int, line: bytes, count: int, mode: str = "block", rate: float = 0.0) -> None:
    """`count` chunk lines on `fd` (a full pipe blocks the write). `block`: copies of the
    pre-encoded `line`, `BLOCK_LINES` a write; `line`: one write per chunk, as an agent that sends
    each chunk as it has it; `encode`: each chunk encoded (`json.dumps`) and written on its own, as
    a real agent streaming a model's tokens does. `rate` (line, encode): at most that many a second."""
    if mode in ("line", "encode"):
        message = json.loads(line) if mode == "encode" else None
        clock = time.perf_counter
        interval = 1.0 / rate if rate > 0 else 0.0
        start = clock()
        for i in range(count):
            if interval:
                due = start + i * interval
                while clock() < due:
                    pass
            data = line if message is None else (json.dumps(message, separators=(",", ":")) + "\n").encode()
            _write_all(fd, data)
        return
    block = line * BLOCK_LINES
    full, rest = divmod(count, BLOCK_LINES)
    for _ in range(full):
        _write_all(fd, block)
    if rest:
        _write_all(fd, line * rest)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def prompt_count(params: dict[str, Any]) -> int:
    text = "".join(block.get("text", "") for block in params.get("prompt") or [] if isinstance(block, dict))
    match = NUMBER.search(text)
    return int(match.group()) if match else DEFAULT_CHUNKS


def serve(mode: str, rate: float) -> None:
    out = sys.stdout.fileno()
    sessions = 0
    lines: dict[str, bytes] = {}
    for raw in sys.stdin.buffer:
        try:
            message = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(message, dict) or "id" not in message:
            continue  # a notification (session/cancel) or a response: nothing to answer
        method, request_id = message.get("method"), message["id"]
        params = message.get("params") or {}
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": False},
                "agentInfo": {"name": "fast-acp-agent", "version": "1"},
                "authMethods": [],
            }
        elif method == "session/new":
            sessions += 1
            session_id = f"fast-{os.getpid()}-{sessions}"
            lines[session_id] = chunk_line(session_id)
            result = {"sessionId": session_id}
        elif method == "session/prompt" and params.get("sessionId") in lines:
            write_chunks(out, lines[params["sessionId"]], prompt_count(params), mode, rate)
            result = {"stopReason": "end_turn"}
        else:
            _write_all(
                out,
                encode(
                    {
                        "jsonrpc": "2.0",
                        "id": request_id,
                        "error": {"code": -32601, "message": f"Method not found: {method}"},
                    }
                ),
            )
            continue
        _write_all(out, encode({"jsonrpc": "2.0", "id": request_id, "result": result}))


def standalone(count: int, mode: str, rate: float) -> None:
    read_fd, write_fd = os.pipe()
    counted = [0]

    def drain() -> None:
        while chunk := os.read(read_fd, 1 << 20):
            counted[0] += chunk.count(b"\n")

    reader = threading.Thread(target=drain)
    reader.start()
    start = time.perf_counter()
    write_chunks(write_fd, chunk_line("fast-standalone"), count, mode, rate)
    os.close(write_fd)
    reader.join()
    elapsed = time.perf_counter() - start
    os.close(read_fd)
    assert counted[0] == count, (counted[0], count)
    how = f"{BLOCK_LINES} pre-encoded lines a write" if mode == "block" else WRITES[mode]
    if rate and mode != "block":
        how += f", at most {rate:,.0f} a second"
    print(
        f"fast ACP agent ({mode}: {how}): {count:,} agent_message_chunk lines in {elapsed:.3f} s = "
        f"{count / elapsed:,.0f} lines/s"
    )


WRITES = {"block": "", "line": "one pre-encoded line a write", "encode": "each line encoded and written on its own"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=sorted(WRITES), default="block", help="how chunks are written")
    parser.add_argument("--rate", type=float, default=0.0, help="line, encode: messages a second at most")
    parser.add_argument("--standalone", type=int, metavar="N", help="write N chunks to a pipe, print the rate, exit")
    args = parser.parse_args()
    if args.standalone:
        standalone(args.standalone, args.mode, args.rate)
    else:
        serve(args.mode, args.rate)


if __name__ == "__main__":
    main()
