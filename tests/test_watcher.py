"""The workspace watcher: inotify (watchfiles) → `files.changed` on runs and on the workspace stream.

Checked: an external write inside a run's allowed roots is reported once (cause `external`) on the
active run and on `GET /v1/workspaces/{id}/events`; a write through the tool facade is reported
once with cause `tool` and its receipt id; changes outside the allowed roots are not reported;
the workspace stream resumes with Last-Event-ID, also across a gateway restart; watching stops
when no run of the workspace is active. Every wait is bounded; writes are synchronised on events
(a later "sentinel" change), never on sleeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent_gateway.app import GATEWAY_KEY, create_app
from agent_gateway.config import Config
from agent_gateway.plugin_host import PluginHost
from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import WAIT, gateway_of
from tests._watcher import Stream, changed, write

WS = "local:ws"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "notes").mkdir(parents=True)
    (root / "other").mkdir()
    (root / "notes" / "page.md").write_text("alpha\nbeta\n", encoding="utf-8")
    return root


Start = Callable[..., Awaitable[TestClient]]


@pytest.fixture
async def start(fake_llm: FakeOpenAI, workspace: Path, tmp_path: Path) -> AsyncIterator[Start]:
    """A gateway with the watcher (wired here when app.py does not wire it yet)."""
    clients: list[TestClient] = []

    async def factory(data_dir: Path | None = None, linger: float = 30.0) -> TestClient:
        config = Config.load(
            None,
            env={},
            overrides={
                "gateway": {"data_dir": str(data_dir or tmp_path / "gw")},
                "chat_only": {"base_url": fake_llm.base_url, "model": "m"},
                "workspaces": {"roots": {WS: str(workspace)}},
                "reasonix": {"enabled": False},
                "hermes": {"enabled": False},
                "pi_lab": {"enabled": False},
            },
        )
        app = create_app(config, PluginHost.load(env={}))
        gateway = app[GATEWAY_KEY]
        gateway.watcher.linger = linger
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    try:
        yield factory
    finally:
        for client in reversed(clients):
            await client.close()


def run_body(roots: list[str], workspace_id: str = WS) -> dict[str, Any]:
    return {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": "chat-only",
        "sessionId": "s-" + uuid.uuid4().hex[:10],
        "workspaceId": workspace_id,
        "message": "keep going",
        "context": {"allowedRoots": roots},
    }


async def active_run(client: TestClient, fake: FakeOpenAI, roots: list[str]) -> str:
    """A chat-only run that stays `running` (its model call hangs) until cancelled."""
    fake.add(Reply(text="thinking", hang=True))
    created = await (await client.post("/v1/runs", json=run_body(roots))).json()
    await gateway_of(client).watcher.ready(WS, created["hostRunId"], timeout=WAIT)
    return str(created["hostRunId"])


async def test_external_write_is_reported_once_on_the_run_and_the_workspace(
    start: Start, fake_llm: FakeOpenAI, workspace: Path
) -> None:
    client = await start()
    run_id = await active_run(client, fake_llm, ["notes/"])
    async with (
        Stream(client, f"/v1/runs/{run_id}/stream") as run_stream,
        Stream(client, f"/v1/workspaces/{WS}/events") as ws_stream,
    ):
        await write(workspace / "notes" / "new.md", "hello")
        await write(workspace / "other" / "secret.md", "not yours")  # outside the allowed roots
        event = await run_stream.until(changed("notes/new.md"))
        change = next(c for c in event["data"]["payload"]["changes"] if c["path"] == "notes/new.md")
        assert change == {"path": "notes/new.md", "change": "added", "cause": "external"}
        assert event["data"]["source"] == "watcher" and event["data"]["payload"]["workspaceId"] == WS
        await ws_stream.until(changed("notes/new.md"))
        # A later change (the sentinel) proves the earlier one was not reported again.
        await write(workspace / "notes" / "page.md", "alpha\nbeta\ngamma\n")
        await run_stream.until(changed("notes/page.md"))
        await ws_stream.until(changed("notes/page.md"))
        for stream in (run_stream, ws_stream):
            paths = [c["path"] for c in stream.changes()]
            assert paths.count("notes/new.md") == 1, paths
            assert not any(p.startswith("other/") for p in paths), paths
            page = next(c for c in stream.changes() if c["path"] == "notes/page.md")
            assert page["change"] == "modified" and page["cause"] == "external"
        await asyncio.to_thread((workspace / "notes" / "new.md").unlink)
        deleted = await run_stream.until(
            lambda e: (
                changed("notes/new.md")(e) and any(c["change"] == "deleted" for c in e["data"]["payload"]["changes"])
            )
        )
        assert deleted
    await client.post(f"/v1/runs/{run_id}/cancel", json={})


async def test_facade_write_is_reported_once_with_its_receipt(
    start: Start, fake_llm: FakeOpenAI, workspace: Path
) -> None:
    client = await start()
    gw = gateway_of(client)
    run_id = await active_run(client, fake_llm, ["notes/"])
    run = await gw.runs.get(run_id, "local")
    assert run is not None
    scope = gw.tools.scope_for(run)
    async with (
        Stream(client, f"/v1/runs/{run_id}/stream") as run_stream,
        Stream(client, f"/v1/workspaces/{WS}/events") as ws_stream,
    ):
        created = await gw.tools.call("workspace.write_file", {"path": "notes/made.md", "text": "by tool\n"}, scope)
        patched = await gw.tools.call(
            "workspace.patch_file", {"path": "notes/page.md", "edits": [{"search": "beta", "replace": "BETA"}]}, scope
        )
        for stream in (run_stream, ws_stream):
            made = await stream.until(changed("notes/made.md"))
            page = await stream.until(changed("notes/page.md"))
            made_change = next(c for c in made["data"]["payload"]["changes"] if c["path"] == "notes/made.md")
            page_change = next(c for c in page["data"]["payload"]["changes"] if c["path"] == "notes/page.md")
            assert made_change["afterVersion"]["sha256"] == hashlib.sha256(b"by tool\n").hexdigest()
            assert "beforeVersion" not in made_change  # created
            assert {k: made_change[k] for k in ("path", "change", "cause", "receiptId")} == {
                "path": "notes/made.md",
                "change": "added",
                "cause": "tool",
                "receiptId": created["receiptId"],
            }
            assert page_change["beforeVersion"]["sha256"] == hashlib.sha256(b"alpha\nbeta\n").hexdigest()
            assert page_change["afterVersion"]["sha256"] == hashlib.sha256(b"alpha\nBETA\n").hexdigest()
            assert {k: page_change[k] for k in ("path", "change", "cause", "receiptId")} == {
                "path": "notes/page.md",
                "change": "modified",
                "cause": "tool",
                "receiptId": patched["receiptId"],
            }
        # The sentinel: an external change after the tool writes.
        await write(workspace / "notes" / "after.md", "x")
        for stream in (run_stream, ws_stream):
            await stream.until(changed("notes/after.md"))
            paths = [c["path"] for c in stream.changes()]
            assert paths.count("notes/made.md") == 1 and paths.count("notes/page.md") == 1, paths
            assert not any(p.rsplit("/", 1)[-1].startswith(".ag-tmp-") for p in paths)
        # The facade's own events are there too, and its tool.completed comes right before the
        # files.changed it reports (source "tool"), naming the same receipt.
        kinds = [(e["event"], e["data"]["source"]) for e in run_stream.events]
        first_done = kinds.index(("tool.completed", "tool"))
        assert kinds[first_done + 1] == ("files.changed", "tool"), kinds
        tool_done = run_stream.events[first_done]
        assert tool_done["data"]["payload"]["receiptId"] == created["receiptId"]
        assert [e["data"]["source"] for e in ws_stream.events if e["event"] == "files.changed"][:2] == [
            "watcher",
            "watcher",
        ]
    await client.post(f"/v1/runs/{run_id}/cancel", json={})


async def test_runs_only_see_their_allowed_roots(start: Start, fake_llm: FakeOpenAI, workspace: Path) -> None:
    client = await start()
    notes_run = await active_run(client, fake_llm, ["notes/"])
    other_run = await active_run(client, fake_llm, ["other/"])
    async with (
        Stream(client, f"/v1/runs/{notes_run}/stream") as notes,
        Stream(client, f"/v1/runs/{other_run}/stream") as other,
        Stream(client, f"/v1/workspaces/{WS}/events") as ws,
    ):
        await write(workspace / "other" / "o.md", "o")
        await other.until(changed("other/o.md"))
        await write(workspace / "notes" / "n.md", "n")
        await notes.until(changed("notes/n.md"))
        await ws.until(changed("notes/n.md"))
        await write(workspace / "other" / "o2.md", "o2")  # sentinel for the other run
        await other.until(changed("other/o2.md"))
        assert all(c["path"].startswith("notes/") for c in notes.changes()), notes.changes()
        assert all(c["path"].startswith("other/") for c in other.changes()), other.changes()
        assert {c["path"] for c in ws.changes()} >= {"other/o.md", "notes/n.md"}
    for run_id in (notes_run, other_run):
        await client.post(f"/v1/runs/{run_id}/cancel", json={})


async def test_workspace_stream_resumes_with_last_event_id_across_restarts(
    start: Start, fake_llm: FakeOpenAI, workspace: Path, tmp_path: Path
) -> None:
    data_dir = tmp_path / "gw-data"
    client = await start(data_dir=data_dir)
    run_id = await active_run(client, fake_llm, ["notes/"])
    async with Stream(client, f"/v1/workspaces/{WS}/events") as ws:
        await write(workspace / "notes" / "one.md", "1")
        first = await ws.until(changed("notes/one.md"))
        await write(workspace / "notes" / "two.md", "2")
        second = await ws.until(changed("notes/two.md"))
    async with Stream(client, f"/v1/workspaces/{WS}/events", {"Last-Event-ID": first["id"]}) as resumed:
        again = await resumed.until(lambda e: e["event"] == "files.changed")
        assert again["id"] == second["id"], "resumed right after the given event, with no gap"
        assert int(first["id"]) not in [int(e["id"]) for e in resumed.events]
    await client.post(f"/v1/runs/{run_id}/cancel", json={})
    await client.close()

    client2 = await start(data_dir=data_dir)
    run2 = await active_run(client2, fake_llm, ["notes/"])
    async with Stream(client2, f"/v1/workspaces/{WS}/events", {"Last-Event-ID": second["id"]}) as after_restart:
        await write(workspace / "notes" / "three.md", "3")
        third = await after_restart.until(changed("notes/three.md"))
        assert int(third["id"]) > int(second["id"]), "seqs continue after a restart, never reused"
        assert not any(changed("notes/one.md")(e) for e in after_restart.events)
    await client2.post(f"/v1/runs/{run2}/cancel", json={})


async def test_watching_stops_when_no_run_of_the_workspace_is_active(
    start: Start, fake_llm: FakeOpenAI, workspace: Path
) -> None:
    client = await start(linger=0.05)
    gw = gateway_of(client)
    assert gw.watcher.watching(WS) == ()
    run_id = await active_run(client, fake_llm, ["notes/"])
    assert gw.watcher.watching(WS) == (str((workspace / "notes").resolve()),)
    watch_task = gw.watcher._watches[WS].task
    assert watch_task is not None
    await client.post(f"/v1/runs/{run_id}/cancel", json={})
    await gw.runs.wait(run_id)
    async with asyncio.timeout(WAIT):
        await asyncio.gather(watch_task, return_exceptions=True)  # ends once the linger is over
    assert gw.watcher.watching(WS) == ()
    response = await client.get("/v1/workspaces/nope/events")
    assert response.status == 404
