"""The floor of a short run: a bare aiohttp server doing a run's HTTP work and nothing else.

    python bench/_floor_server.py [--store FILE]   (OPENAI_BASE_URL: the upstream; OPENAI_MODEL: its answer)

What `bench_run_cost.py` times beside the gateway: `POST /v1/runs` (a JSON body read, an id
answered), one streamed chat completion from the upstream on a kept-alive aiohttp client
session, each delta written to `GET /v1/runs/{id}/stream` as an SSE event (or to the POST's own
response, with `Accept: text/event-stream`), and a terminal event. No journal, storage, spool,
session, index, validation, middleware or log: what any aiohttp gateway pays for the same
requests, which no gateway on aiohttp can go below. Answers the bench's other requests
(`/v1/health`, `/metrics`, `/v1/sessions`) trivially. Prints its URL, then serves until killed.

`--store FILE`: the floor of a run that is kept, too. At its end each run is stored in a SQLite
file set up as the gateway's journal is (WAL, `synchronous=NORMAL`): its row and its events, in
one transaction made on the event loop's thread (no worker, no thread hand-over, no ORM). No
spool, session record, session index or search text: the least any gateway that keeps its runs
in SQLite does per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import time
from typing import Any

from aiohttp import ClientSession, web

UPSTREAM = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
MODEL = os.environ.get("OPENAI_MODEL", "n3")  # the answer asked for (bench_fairness's upstream)
HTTP_KEY = web.AppKey("http", ClientSession)
RUNS_KEY = web.AppKey("runs", dict)
STORE_KEY = web.AppKey("store", sqlite3.Connection)


def _open_store(path: str) -> sqlite3.Connection:
    store = sqlite3.connect(path, isolation_level=None)
    store.execute("PRAGMA journal_mode = wal")
    store.execute("PRAGMA synchronous = NORMAL")
    store.execute(
        "CREATE TABLE IF NOT EXISTS runs (host_run_id TEXT PRIMARY KEY, request TEXT NOT NULL,"
        " status TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)"
    )
    store.execute(
        "CREATE TABLE IF NOT EXISTS events (host_run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,"
        " payload TEXT NOT NULL, created_at INTEGER NOT NULL, PRIMARY KEY (host_run_id, seq))"
    )
    return store


def _keep(store: sqlite3.Connection, run_id: str, request: str, events: list[tuple[int, str, str]]) -> None:
    """Store an ended run: its row and its events, one transaction."""
    now = int(time.time() * 1000)
    store.execute("BEGIN IMMEDIATE")
    try:
        store.execute("INSERT INTO runs VALUES (?, ?, 'completed', ?, ?)", (run_id, request, now, now))
        store.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", [(run_id, *event, now) for event in events])
    except BaseException:
        store.execute("ROLLBACK")
        raise
    store.execute("COMMIT")


async def _relay(
    http: ClientSession, events: asyncio.Queue[bytes | None], kept: list[tuple[int, str, str]] | None = None
) -> None:
    """Stream one chat completion, each delta's SSE frame onto `events`; None at the end. With
    `kept`, each event (seq, kind, payload) is added to it too."""
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    seq = 0
    try:
        async with http.post(UPSTREAM + "/chat/completions", json=body) as response:
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        seq += 1
                        data = json.dumps({"text": text})
                        events.put_nowait(f"id: {seq}\nevent: message.delta\ndata: {data}\n\n".encode())
                        if kept is not None:
                            kept.append((seq, "message.delta", data))
        events.put_nowait(f"id: {seq + 1}\nevent: run.completed\ndata: {{}}\n\n".encode())
        if kept is not None:
            kept.append((seq + 1, "run.completed", "{}"))
    finally:
        events.put_nowait(None)


async def _run(
    http: ClientSession,
    events: asyncio.Queue[bytes | None],
    store: sqlite3.Connection | None,
    run_id: str,
    request: str,
) -> None:
    """Relay the run; with a store, keep it at its end."""
    kept: list[tuple[int, str, str]] | None = None if store is None else []
    await _relay(http, events, kept)
    if store is not None and kept is not None:
        _keep(store, run_id, request, kept)


async def _stream(request: web.Request, events: asyncio.Queue[bytes | None]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    while (frame := await events.get()) is not None:
        await response.write(frame)
    return response


async def create(request: web.Request) -> web.StreamResponse:
    body = await request.text()
    json.loads(body)
    run_id = "run_" + secrets.token_hex(8)
    events: asyncio.Queue[bytes | None] = asyncio.Queue()
    task = asyncio.create_task(_run(request.app[HTTP_KEY], events, request.app.get(STORE_KEY), run_id, body))
    runs: dict[str, Any] = request.app[RUNS_KEY]
    if "text/event-stream" in request.headers.get("Accept", ""):
        try:
            return await _stream(request, events)
        finally:
            await task
    runs[run_id] = (events, task)
    return web.json_response({"hostRunId": run_id, "status": "running"}, status=201)


async def stream(request: web.Request) -> web.StreamResponse:
    events, task = request.app[RUNS_KEY].pop(request.match_info["run_id"])
    try:
        return await _stream(request, events)
    finally:
        await task


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=f'agent_gateway_runs_active{{agent="floor"}} {len(request.app[RUNS_KEY])}\n')


async def sessions(request: web.Request) -> web.Response:
    return web.json_response({"items": []})


async def _client(app: web.Application) -> Any:
    app[HTTP_KEY] = ClientSession()
    yield
    await app[HTTP_KEY].close()


async def main(store: str | None) -> None:
    app = web.Application()
    app[RUNS_KEY] = {}
    if store:
        app[STORE_KEY] = _open_store(store)
    app.cleanup_ctx.append(_client)
    app.router.add_post("/v1/runs", create)
    app.router.add_get("/v1/runs/{run_id}/stream", stream)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/sessions", sessions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="a SQLite file to keep each run in (created if missing)")
    asyncio.run(main(parser.parse_args().store))
