"""The tool facade and the workspace tools: the pipeline order, receipts in real (peewee SQLite)
storage, tool.* events in a real journal, patching, version checks, atomic writes, the receipts
route. Hostile paths are in test_hostile_paths.py (which reuses the harness below)."""

from __future__ import annotations

import difflib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import agent_gateway.plugins.workspace as workspace_plugin
from agent_gateway.app import GATEWAY_KEY, create_app
from agent_gateway.config import Config
from agent_gateway.hookspecs import hookimpl
from agent_gateway.json_schema import cached_validator, compile_schema
from agent_gateway.models import Run
from agent_gateway.paths import PathError, resolve_path
from agent_gateway.plugin_host import PluginHost
from agent_gateway.plugins.workspace.patching import PatchError, apply_edits, apply_unified_diff
from agent_gateway.tools import Tool, ToolCall, ToolError, ToolFacade, validate_schema
from tests._tools import (  # noqa: F401  (fixtures)
    PAGE,
    PAGE_TEXT,
    SELECTION,
    Harness,
    HarnessFactory,
    Recorder,
    build_tree,
    h_fixture,
    make_harness_fixture,
    sha,
)

# -- the harness (also used by test_hostile_paths.py) ------------------------------------------------


# -- listing and the happy paths ------------------------------------------------------------------


def test_tools_are_listed_mcp_style(h: Harness) -> None:
    listed = h.facade.list_tools(h.scope)
    names = [t["name"] for t in listed]
    assert names == [
        "workspace.read_current_page",
        "workspace.read_selection",
        "workspace.describe_roots",
        "workspace.read_file",
        "workspace.patch_file",
        "workspace.write_file",
        "workspace.write_receipt_note",
    ]
    assert not any("shell" in n or "bash" in n for n in names)
    for entry in listed:
        assert set(entry) >= {"name", "description", "inputSchema"}
        assert entry["inputSchema"]["type"] == "object"
        assert entry["inputSchema"]["additionalProperties"] is False


async def test_read_file_writes_receipt_and_events(h: Harness) -> None:
    result = await h.call("workspace.read_file", {"path": "notes/a.md"})
    data = (h.ws / "notes" / "a.md").read_bytes()
    assert result["text"] == data.decode()
    assert result["path"] == "notes/a.md"
    assert result["version"]["sha256"] == sha(data)
    assert result["version"]["size"] == len(data)
    assert result["version"]["mtimeNs"] == os.stat(h.ws / "notes" / "a.md").st_mtime_ns

    [receipt] = h.receipts()
    assert receipt["receiptId"] == result["receiptId"]
    assert receipt["schema"] == "gateway.tool_receipt.v1"
    assert receipt["hostRunId"] == h.run.host_run_id
    assert receipt["actorId"] == "alice"
    assert receipt["workspaceId"] == "ws1"
    assert receipt["root"] == "notes/"
    assert receipt["page"] == PAGE
    assert receipt["tool"] == "workspace.read_file"
    assert receipt["path"] == "notes/a.md"
    assert receipt["allowed"] is True
    assert receipt["reason"] is None
    assert receipt["diffSummary"] is None
    assert receipt["beforeVersion"]["sha256"] == sha(data)
    assert receipt["afterVersion"] is None
    assert receipt["agentSessionId"] == "agent-sess-1"
    assert receipt["model"] == "model-x"
    assert receipt["caller"] == "test"
    assert isinstance(receipt["createdAt"], int)
    assert "beta" not in json.dumps(receipt)  # no file contents in a receipt

    started, completed = await h.events()
    assert started.kind == "tool.started" and completed.kind == "tool.completed"
    assert started.source == "tool"
    assert started.payload["toolCallId"] == completed.payload["toolCallId"] == receipt["toolCallId"]
    assert started.payload["arguments"] == {"path": "notes/a.md"}
    assert completed.payload["status"] == "completed"
    assert completed.payload["receiptId"] == receipt["receiptId"]
    assert "beta" not in json.dumps([started.payload, completed.payload])


async def test_absolute_path_inside_a_root_is_normalised(h: Harness) -> None:
    result = await h.call("workspace.read_file", {"path": str(h.ws / "notes" / "sub" / "b.md")})
    assert result["path"] == "notes/sub/b.md"
    assert h.receipts()[0]["path"] == "notes/sub/b.md"
    started = (await h.events())[0]
    assert started.payload["arguments"]["path"] == "notes/sub/b.md"


async def test_symlink_inside_the_roots_is_followed_to_its_real_path(h: Harness) -> None:
    (h.ws / "notes" / "alias.md").symlink_to("sub/b.md")
    result = await h.call("workspace.read_file", {"path": "notes/alias.md"})
    assert result["path"] == "notes/sub/b.md"
    assert result["text"] == "inside b\n"


async def test_current_page_and_selection_come_from_the_frozen_context(h: Harness) -> None:
    page = await h.call("workspace.read_current_page", {})
    assert page["path"] == PAGE and page["text"] == PAGE_TEXT
    (h.ws / PAGE).write_text("changed on disk\n")
    selection = await h.call("workspace.read_selection", {})
    assert selection["selection"] == SELECTION  # frozen when the run started, not re-read
    assert selection["path"] == PAGE
    receipts = h.receipts()
    assert [r["tool"] for r in receipts] == ["workspace.read_current_page", "workspace.read_selection"]
    assert receipts[0]["path"] == PAGE and receipts[1]["path"] is None
    assert "line two" not in json.dumps(receipts)


async def test_current_page_outside_the_roots_or_missing_is_refused(make_harness: HarnessFactory) -> None:
    h = await make_harness(target={"path": "private/secret.md"})
    await h.refused("workspace.read_current_page", {}, "outside_roots")
    h2 = await make_harness(target={})
    error = await h2.refused("workspace.read_current_page", {}, "not_found")
    assert "page" in error.message
    assert (await h2.call("workspace.read_selection", {}))["selection"] is None


async def test_describe_roots_hides_host_paths(make_harness: HarnessFactory) -> None:
    h = await make_harness(allowed_roots=["notes/", "./notes/sub", "../outside", "missing/", "/etc"])
    result = await h.call("workspace.describe_roots", {})
    text = json.dumps(result) + json.dumps(h.receipts())
    assert str(h.tmp) not in text and str(h.ws) not in text
    roots = {r["root"]: r for r in result["roots"]}
    assert roots["notes/"]["usable"] and roots["notes/sub/"]["usable"]
    assert not roots["../outside"]["usable"] and "'..'" in roots["../outside"]["problem"]
    assert not roots["missing/"]["usable"]
    assert not roots["/etc"]["usable"] and "outside the workspace" in roots["/etc"]["problem"]
    assert result["workspaceId"] == "ws1" and result["shell"] is False


async def test_write_receipt_note(h: Harness) -> None:
    result = await h.call("workspace.write_receipt_note", {"note": "renamed the heading because the user asked"})
    [receipt] = h.receipts()
    assert receipt["receiptId"] == result["receiptId"]
    assert receipt["tool"] == "workspace.write_receipt_note"
    assert receipt["note"] == "renamed the heading because the user asked"
    assert receipt["allowed"] is True


# -- patching and writing --------------------------------------------------------------------------


async def test_patch_with_search_replace(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    before = target.read_bytes()
    read = await h.call("workspace.read_file", {"path": "notes/a.md"})
    result = await h.call(
        "workspace.patch_file",
        {
            "path": "notes/a.md",
            "expectedHash": read["version"]["sha256"],
            "edits": [{"search": "beta\n", "replace": "BETA\nbeta two\n"}, {"search": "gamma", "replace": "GAMMA"}],
        },
    )
    assert target.read_text() == "alpha\nBETA\nbeta two\nGAMMA\n"
    assert result["changed"] is True
    assert result["version"]["sha256"] == sha(target.read_bytes())
    receipt = h.receipts()[-1]
    assert receipt["allowed"] is True and receipt["tool"] == "workspace.patch_file"
    assert receipt["beforeVersion"]["sha256"] == sha(before)
    assert receipt["afterVersion"]["sha256"] == sha(target.read_bytes())
    diff = receipt["diffSummary"]
    assert diff["linesAdded"] == 3 and diff["linesRemoved"] == 2
    assert "+BETA" in diff["head"] and "-beta" in diff["head"]
    assert diff["truncated"] is False and diff["created"] is False
    completed = (await h.events())[-1]
    assert completed.payload["diffSummary"] == {"created": False, "linesAdded": 3, "linesRemoved": 2}


async def test_patch_search_must_match_exactly_once(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    target.write_text("x\nsame\nsame\n")
    before = target.read_bytes()
    error = await h.refused(
        "workspace.patch_file",
        {"path": "notes/a.md", "edits": [{"search": "x", "replace": "y"}, {"search": "same", "replace": "z"}]},
        "patch_failed",
    )
    assert "edit 2" in error.message and "more than once" in error.message
    error = await h.refused(
        "workspace.patch_file", {"path": "notes/a.md", "edits": [{"search": "nope", "replace": "z"}]}, "patch_failed"
    )
    assert "edit 1" in error.message and "not found" in error.message
    assert target.read_bytes() == before  # the first edit of a failing batch is not written either
    receipt = h.receipts()[-1]
    assert receipt["allowed"] is False and receipt["errorCode"] == "patch_failed" and receipt["diffSummary"] is None


async def test_patch_with_unified_diff(h: Harness) -> None:
    target = h.ws / "notes" / "long.md"
    old = [f"line {i}\n" for i in range(1, 41)]
    target.write_text("".join(old))
    new = list(old)
    new[4] = "line five\n"
    new.insert(30, "inserted\n")
    del new[38]
    diff = "".join(difflib.unified_diff(old, new, "a/notes/long.md", "b/notes/long.md"))
    result = await h.call("workspace.patch_file", {"path": "notes/long.md", "unifiedDiff": diff})
    assert result["changed"] is True
    assert target.read_text() == "".join(new)
    summary = h.receipts()[-1]["diffSummary"]
    assert summary["linesAdded"] == 2 and summary["linesRemoved"] == 2


async def test_unified_diff_with_wrong_line_numbers_finds_its_context(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    diff = "--- a/notes/a.md\n+++ b/notes/a.md\n@@ -7,3 +7,3 @@\n alpha\n-beta\n+BETA\n gamma\n"
    await h.call("workspace.patch_file", {"path": "notes/a.md", "unifiedDiff": diff})
    assert target.read_text() == "alpha\nBETA\ngamma\n"
    bad = "@@ -1,2 +1,2 @@\n alpha\n-delta\n+DELTA\n"
    error = await h.refused("workspace.patch_file", {"path": "notes/a.md", "unifiedDiff": bad}, "patch_failed")
    assert "hunk 1" in error.message
    assert target.read_text() == "alpha\nBETA\ngamma\n"


async def test_stale_expected_hash_is_refused_and_nothing_is_written(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    read = await h.call("workspace.read_file", {"path": "notes/a.md"})
    target.write_text("another writer was here\n")
    error = await h.refused(
        "workspace.patch_file",
        {
            "path": "notes/a.md",
            "expectedHash": read["version"]["sha256"],
            "edits": [{"search": "another", "replace": "agent"}],
        },
        "stale_version",
    )
    assert "changed since it was read" in error.message
    assert target.read_text() == "another writer was here\n"
    receipt = h.receipts()[-1]
    assert receipt["allowed"] is False and receipt["errorCode"] == "stale_version"
    assert receipt["beforeVersion"]["sha256"] == sha(b"another writer was here\n")
    assert receipt["afterVersion"] is None and receipt["diffSummary"] is None


async def test_stale_expected_mtime_is_refused(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    mtime = os.stat(target).st_mtime_ns
    os.utime(target, ns=(mtime + 5_000_000_000, mtime + 5_000_000_000))
    await h.refused(
        "workspace.patch_file",
        {"path": "notes/a.md", "expectedMtime": mtime, "edits": [{"search": "alpha", "replace": "A"}]},
        "stale_version",
    )
    assert target.read_text().startswith("alpha")
    fresh = os.stat(target).st_mtime_ns
    await h.call(
        "workspace.patch_file",
        {"path": "notes/a.md", "expectedMtime": fresh, "edits": [{"search": "alpha", "replace": "A"}]},
    )
    assert target.read_text().startswith("A\n")


async def test_atomic_write_keeps_the_mode_and_leaves_no_temp_files(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    os.chmod(target, 0o640)
    inode = os.stat(target).st_ino
    await h.call("workspace.patch_file", {"path": "notes/a.md", "edits": [{"search": "gamma", "replace": "G"}]})
    st = os.stat(target)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_ino != inode  # replaced by rename, not rewritten in place
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.md", "sub", "today.md"]
    assert target.read_text() == "alpha\nbeta\nG\n"


async def test_write_file_creates_and_replaces_only_with_a_version(h: Harness) -> None:
    new = h.ws / "notes" / "sub" / "new.md"
    created = await h.call("workspace.write_file", {"path": "notes/sub/new.md", "text": "fresh\n"})
    assert created["created"] is True and new.read_text() == "fresh\n"
    receipt = h.receipts()[-1]
    assert receipt["diffSummary"]["created"] is True and receipt["diffSummary"]["linesAdded"] == 1
    assert receipt["beforeVersion"] is None and receipt["afterVersion"]["sha256"] == sha(b"fresh\n")

    error = await h.refused("workspace.write_file", {"path": "notes/sub/new.md", "text": "x"}, "already_exists")
    assert "expectedHash" in error.message
    assert new.read_text() == "fresh\n"

    await h.call(
        "workspace.write_file", {"path": "notes/sub/new.md", "text": "second\n", "expectedHash": sha(b"fresh\n")}
    )
    assert new.read_text() == "second\n"

    await h.refused(
        "workspace.write_file", {"path": "notes/sub/other.md", "text": "x", "expectedHash": sha(b"x")}, "stale_version"
    )
    assert not (h.ws / "notes" / "sub" / "other.md").exists()
    await h.refused("workspace.write_file", {"path": "notes/nodir/x.md", "text": "x"}, "not_found")


async def test_read_file_refuses_binary_non_utf8_and_large_files(make_harness: HarnessFactory) -> None:
    h = await make_harness(workspace_tools={"max_read_bytes": 64})
    (h.ws / "notes" / "bin.dat").write_bytes(b"\x89PNG\x00\x01")
    (h.ws / "notes" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (h.ws / "notes" / "big.md").write_text("x" * 65)
    assert "NUL" in (await h.refused("workspace.read_file", {"path": "notes/bin.dat"}, "not_text")).message
    assert "UTF-8" in (await h.refused("workspace.read_file", {"path": "notes/latin1.txt"}, "not_text")).message
    assert "limit is 64" in (await h.refused("workspace.read_file", {"path": "notes/big.md"}, "too_large")).message
    await h.refused(
        "workspace.patch_file", {"path": "notes/big.md", "edits": [{"search": "x", "replace": "y"}]}, "too_large"
    )
    assert (h.ws / "notes" / "big.md").read_text() == "x" * 65


async def test_workspace_tools_can_be_switched_off(make_harness: HarnessFactory) -> None:
    h = await make_harness(workspace_tools={"enabled": False})
    assert h.facade.list_tools(h.scope) == []
    await h.refused("workspace.read_file", {"path": "notes/a.md"}, "unknown_tool")


# -- the pipeline: validation, capabilities, veto, hooks --------------------------------------------


async def test_a_veto_refuses_before_the_handler_runs(make_harness: HarnessFactory) -> None:
    recorder = Recorder(lambda call: "patches need a human" if call.name == "workspace.patch_file" else None)
    h = await make_harness(extra_plugins=(recorder,))
    target = h.ws / "notes" / "a.md"
    before = target.read_bytes()
    error = await h.refused(
        "workspace.patch_file",
        {"path": "./notes//a.md", "edits": [{"search": "alpha", "replace": "A"}]},
        "vetoed",
    )
    assert error.message == "patches need a human"
    assert target.read_bytes() == before
    assert recorder.vetoed == [("workspace.patch_file", {"path": "notes/a.md"})]  # saw the normalised path
    [receipt] = h.receipts()
    assert receipt["allowed"] is False and receipt["reason"] == "patches need a human"
    assert receipt["errorCode"] == "vetoed" and receipt["path"] == "notes/a.md"
    assert receipt["beforeVersion"]["sha256"] == sha(before) and receipt["afterVersion"] is None
    assert recorder.completed == [receipt]
    started, completed = await h.events()
    assert started.payload["arguments"]["path"] == "notes/a.md"
    assert completed.payload["status"] == "failed"
    assert completed.payload["error"] == {"code": "vetoed", "message": "patches need a human"}
    await h.call("workspace.read_file", {"path": "notes/a.md"})  # other tools pass
    assert len(recorder.completed) == 2 and recorder.completed[1]["allowed"] is True


async def test_checks_run_in_order_and_the_veto_only_sees_checked_calls(make_harness: HarnessFactory) -> None:
    recorder = Recorder()
    h = await make_harness(extra_plugins=(recorder,))
    await h.refused("workspace.read_file", {"path": 3}, "invalid_arguments")
    await h.refused("workspace.read_file", {"path": "../x"}, "path_refused")
    await h.refused(
        "workspace.patch_file",
        {"path": "notes/a.md", "expectedHash": "0" * 64, "edits": [{"search": "a", "replace": "b"}]},
        "stale_version",
    )
    assert recorder.vetoed == []
    receipts = h.receipts()
    assert [r["errorCode"] for r in receipts] == ["invalid_arguments", "path_refused", "stale_version"]
    assert len(recorder.completed) == 3
    assert receipts[1]["path"] is None and receipts[1]["requestedPath"] == "../x"
    events = await h.events()
    assert [e.kind for e in events] == ["tool.started", "tool.completed"] * 3
    assert all(e.payload["status"] == "failed" for e in events if e.kind == "tool.completed")


async def test_a_broken_veto_hook_fails_closed(make_harness: HarnessFactory) -> None:
    def explode(call: ToolCall) -> str | None:
        raise RuntimeError("policy service down")

    h = await make_harness(extra_plugins=(Recorder(explode),))
    error = await h.refused("workspace.read_file", {"path": "notes/a.md"}, "vetoed")
    assert "RuntimeError" in error.message


async def test_a_disabled_capability_hides_and_refuses_the_tool(h: Harness) -> None:
    scope = h.facade.scope_for(h.run, disabled_capabilities=frozenset({"workspace.write"}))
    names = [t["name"] for t in h.facade.list_tools(scope)]
    assert "workspace.patch_file" not in names and "workspace.write_file" not in names
    assert "workspace.read_file" in names
    error = await h.refused(
        "workspace.write_file", {"path": "notes/x.md", "text": "x"}, "capability_disabled", scope=scope
    )
    assert "workspace.write" in error.message
    assert not (h.ws / "notes" / "x.md").exists()
    assert h.receipts()[-1]["errorCode"] == "capability_disabled"


@pytest.mark.parametrize(
    ("tool", "arguments", "fragment"),
    [
        ("workspace.read_file", {}, "arguments.path is required"),
        ("workspace.read_file", {"path": "notes/a.md", "mode": "rb"}, "arguments.mode is not a known argument"),
        ("workspace.read_file", {"path": ["notes/a.md"]}, "arguments.path must be string, got array"),
        ("workspace.read_file", "notes/a.md", "arguments must be an object, got string"),
        ("workspace.patch_file", {"path": "notes/a.md"}, "give exactly one of: edits; unifiedDiff"),
        (
            "workspace.patch_file",
            {"path": "notes/a.md", "edits": [{"search": "a", "replace": "b"}], "unifiedDiff": "@@"},
            "give exactly one of",
        ),
        ("workspace.patch_file", {"path": "notes/a.md", "edits": [{"replace": "b"}]}, "arguments.edits[0].search"),
        ("workspace.patch_file", {"path": "notes/a.md", "edits": []}, "arguments.edits needs at least 1"),
        (
            "workspace.patch_file",
            {"path": "notes/a.md", "expectedHash": "abc", "edits": [{"search": "a", "replace": "b"}]},
            "arguments.expectedHash does not match",
        ),
        (
            "workspace.patch_file",
            {"path": "notes/a.md", "expectedMtime": True, "edits": [{"search": "a", "replace": "b"}]},
            "arguments.expectedMtime must be integer or null, got boolean",
        ),
        ("workspace.write_receipt_note", {"note": "x" * 2001}, "longer than 2000"),
        ("workspace.write_file", {"path": "notes/x.md", "text": None}, "arguments.text must be string"),
    ],
)
async def test_argument_errors_are_clear(h: Harness, tool: str, arguments: Any, fragment: str) -> None:
    error = await h.refused(tool, arguments, "invalid_arguments")
    assert fragment in error.message, error.message
    assert h.receipts()[-1]["reason"] == error.message
    assert (h.ws / "notes" / "a.md").read_text() == "alpha\nbeta\ngamma\n"


async def test_unknown_tool_and_failing_handler_get_receipts(make_harness: HarnessFactory) -> None:
    class Broken:
        @hookimpl
        def register_tools(self, register: Callable[[Any], None], config: Any) -> None:
            async def handler(call: ToolCall) -> dict[str, Any]:
                raise KeyError("boom")

            register(Tool("test.broken", "fails", {"type": "object"}, ("test",), handler))

    h = await make_harness(extra_plugins=(Broken(),))
    error = await h.refused("no.such_tool", {}, "unknown_tool")
    assert "workspace.read_file" in error.message
    error = await h.refused("test.broken", {}, "handler_failed")
    assert "KeyError" in error.message
    receipts = h.receipts()
    assert [(r["tool"], r["status"]) for r in receipts] == [("no.such_tool", "denied"), ("test.broken", "failed")]


async def test_no_workspace_directory_refuses_every_path(make_harness: HarnessFactory) -> None:
    h = await make_harness(configure_workspace=False)
    await h.refused("workspace.read_file", {"path": "notes/a.md"}, "no_workspace")
    result = await h.call("workspace.describe_roots", {})
    assert result["configured"] is False


async def test_events_truncate_large_arguments(h: Harness) -> None:
    text = "secret-ish content " * 1000
    await h.call("workspace.write_file", {"path": "notes/big.md", "text": text})
    started, _ = await h.events()
    assert len(json.dumps(started.payload)) < 1000
    assert started.payload["arguments"]["text"].endswith(f"…({len(text)} chars)")
    receipt = h.receipts()[-1]
    assert len(receipt["diffSummary"]["head"].encode()) <= 2048 and receipt["diffSummary"]["truncated"] is True
    assert len(json.dumps(receipt)) < 4000


def test_registering_a_tool_twice_is_an_error(h: Harness) -> None:
    tool = h.facade.tools["workspace.read_file"]
    with pytest.raises(ValueError, match="registered twice"):
        ToolFacade([tool, tool], None, h.storage, None, None)
    with pytest.raises(ValueError, match="must match"):
        ToolFacade([Tool("bad name", "", {}, (), tool.handler)], None, h.storage, None, None)


# -- the receipts route -----------------------------------------------------------------------------


async def test_receipts_route(h: Harness) -> None:
    alice = {"Authorization": "Bearer alice-token-0123456789"}
    config = Config.load(
        None,
        env={},
        overrides={
            "gateway": {"data_dir": str(h.tmp / "db")},
            "auth": {"tokens": {"alice-token-0123456789": "alice", "bob-token-0123456789ab": "bob"}},
        },
    )
    plugins = PluginHost.load(env={}, builtins={"core", "journal_peewee"}, extra=(workspace_plugin,))
    await h.call("workspace.read_file", {"path": "notes/a.md"})
    await h.refused("workspace.read_file", {"path": "../x"}, "path_refused")
    await h.journal.flush()
    other = Run("run_bob", "req-b", "pi-lab", "pi", "s-b", "bob", "ws1")
    h.storage.insert_run(other)
    h.storage.insert_receipt({"hostRunId": "run_bob", "actorId": "bob", "createdAt": 1, "tool": "x"})
    app = create_app(config, plugins)
    # the app's own storage is the same SQLite file as the harness's
    assert Path(app[GATEWAY_KEY].storage.path) == h.storage.path
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        response = await client.get(f"/v1/runs/{h.run.host_run_id}/receipts", headers=alice)
        assert response.status == 200, await response.text()
        body = await response.json()
        assert body["schema"] == "gateway.tool_receipts.v1" and body["hostRunId"] == h.run.host_run_id
        assert [r["allowed"] for r in body["receipts"]] == [True, False]
        assert body["receipts"][1]["errorCode"] == "path_refused"
        response = await client.get("/v1/runs/run_bob/receipts", headers=alice)  # another actor's run
        assert response.status == 404 and (await response.json())["error"]["code"] == "run_not_found"
        response = await client.get("/v1/runs/run_nope/receipts", headers=alice)
        assert response.status == 404
        bob = {"Authorization": "Bearer bob-token-0123456789ab"}
        response = await client.get("/v1/runs/run_bob/receipts", headers=bob)
        assert [r["tool"] for r in (await response.json())["receipts"]] == ["x"]
        response = await client.get(f"/v1/runs/{h.run.host_run_id}/receipts")
        assert response.status == 401
    finally:
        await client.close()


# -- unit level: schema validator, patching, paths ----------------------------------------------------


def test_validate_schema_subset() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3}, "e": {"enum": ["a", "b"]}},
        "required": ["n"],
        "additionalProperties": False,
    }
    validate_schema({"n": 2, "e": "a"}, schema)
    for bad, fragment in [
        ({"n": 0}, "at least 1"),
        ({"n": 4}, "at most 3"),
        ({"n": 1.5}, "must be integer"),
        ({"n": True}, "must be integer, got boolean"),
        ({"n": 1, "e": "c"}, "one of 'a', 'b'"),
    ]:
        with pytest.raises(ToolError, match=fragment.replace("(", r"\(")):
            validate_schema(bad, schema)


# Keywords the hand-written subset validator skipped without a word: each is enforced now.
# (schema, a value it accepts, a value it refuses, what the refusal says)
ENFORCED_KEYWORDS = [
    pytest.param(
        {
            "type": "object",
            "$defs": {"name": {"type": "string", "minLength": 2}},
            "properties": {"n": {"$ref": "#/$defs/name"}},
        },
        {"n": "ab"},
        {"n": "a"},
        "arguments.n is shorter than 2 characters",
        id="$ref+$defs",
    ),
    pytest.param(
        {"allOf": [{"type": "object"}, {"required": ["a"]}]},
        {"a": 1},
        {"b": 1},
        "arguments.a is required",
        id="allOf",
    ),
    pytest.param(
        {"type": "object", "not": {"required": ["a", "b"]}},
        {"a": 1},
        {"a": 1, "b": 2},
        'arguments must not match {"required": ["a", "b"]}',
        id="not",
    ),
    pytest.param(
        {"type": "object", "properties": {"v": {"const": 2}}},
        {"v": 2},
        {"v": 3},
        "arguments.v must be 2",
        id="const",
    ),
    pytest.param(
        {
            "type": "object",
            "if": {"properties": {"kind": {"const": "file"}}, "required": ["kind"]},
            "then": {"required": ["path"]},
        },
        {"kind": "file", "path": "a"},
        {"kind": "file"},
        "arguments.path is required",
        id="if/then",
    ),
    pytest.param(
        {"type": "array", "uniqueItems": True},
        [1, 2],
        [1, 1],
        "arguments must not hold the same item twice",
        id="uniqueItems",
    ),
    pytest.param(
        {"type": "object", "patternProperties": {"^x_": {"type": "integer"}}},
        {"x_a": 1, "other": "s"},
        {"x_a": "s"},
        "arguments.x_a must be integer, got string",
        id="patternProperties",
    ),
    pytest.param(
        {"type": "object", "dependentRequired": {"start": ["end"]}},
        {"start": 1, "end": 2},
        {"start": 1},
        "arguments.end is required when start is given",
        id="dependentRequired",
    ),
    pytest.param(
        {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}},
        {"to": "a@example.org"},
        {"to": "nobody"},
        "arguments.to is not a valid email",
        id="format",
    ),
    pytest.param(
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
        {"a": 1},
        {"a": 1, "b": 2},
        "arguments.b is not a known argument (known: a)",
        id="additionalProperties",
    ),
]


@pytest.mark.parametrize(("schema", "good", "bad", "message"), ENFORCED_KEYWORDS)
def test_validate_schema_enforces_every_keyword(schema: dict[str, Any], good: Any, bad: Any, message: str) -> None:
    validate_schema(good, schema)
    with pytest.raises(ToolError) as info:
        validate_schema(bad, schema)
    assert info.value.code == "invalid_arguments"
    assert info.value.message == message


@pytest.mark.parametrize(
    ("schema", "good", "bad", "message"), [p for p in ENFORCED_KEYWORDS if isinstance(p.values[1], dict)]
)
async def test_tool_calls_enforce_every_keyword(
    make_harness: HarnessFactory, schema: dict[str, Any], good: Any, bad: Any, message: str
) -> None:
    """The same keywords through the facade (arguments are objects): checked on every call."""

    class Strict:
        @hookimpl
        def register_tools(self, register: Callable[[Any], None], config: Any) -> None:
            async def handler(call: ToolCall) -> dict[str, Any]:
                return {"ok": True}

            register(Tool("test.strict", "checks its arguments", schema, ("test",), handler))

    h = await make_harness(extra_plugins=(Strict(),))
    assert (await h.call("test.strict", good))["ok"] is True
    error = await h.refused("test.strict", bad, "invalid_arguments")
    assert error.message == message
    assert h.receipts()[-1]["reason"] == message


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"type": "objekt"}, "at /type: 'objekt' is not valid"),
        ({"type": "object", "properties": {"a": {"type": "string", "minLenght": 3}}}, "at /properties/a:"),
        ({"type": "object", "required": "path"}, "at /required: 'path' is not of type 'array'"),
        ({"$defs": {"d": {"bogus": 1}}, "$ref": "#/$defs/d"}, "'bogus' was unexpected"),
        ({"type": "string", "format": "date-time"}, "format 'date-time' cannot be checked here"),
    ],
)
def test_an_invalid_input_schema_is_refused_at_registration(h: Harness, schema: Any, fragment: str) -> None:
    """Refused when the tool is registered (the gateway does not start), naming the tool; never
    ignored at call time."""
    tool = h.facade.tools["workspace.read_file"]
    bad = Tool("test.bad_schema", "", schema, (), tool.handler)
    with pytest.raises(ValueError, match=r"tool 'test\.bad_schema': input_schema is not a valid JSON Schema") as info:
        ToolFacade([bad], None, h.storage, None, None)
    assert fragment in str(info.value)


def test_x_extensions_and_annotations_are_accepted(h: Harness) -> None:
    tool = h.facade.tools["workspace.read_file"]
    schema = {
        "type": "object",
        "title": "t",
        "description": "d",
        "x-ui-hint": "path",
        "properties": {"p": {"type": "string", "default": "a", "examples": ["b"], "deprecated": True}},
    }
    ToolFacade([Tool("test.annotated", "", schema, (), tool.handler)], None, h.storage, None, None)


def test_validate_schema_keeps_its_validator() -> None:
    """Built once per schema and reused: the per-call cost is the validation alone."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    validate_schema({"a": "x"}, schema)
    assert cached_validator(schema) is cached_validator(schema)
    assert cached_validator(schema) is compile_schema(dict(schema))  # an equal schema: the same one
    with pytest.raises(ValueError, match="the schema for body is not a valid JSON Schema"):
        validate_schema({}, {"type": 3}, "body")


def test_apply_edits_handles_crlf_files() -> None:
    assert apply_edits("a\r\nb\r\nc\r\n", [{"search": "b\nc", "replace": "B\nC"}]) == "a\r\nB\r\nC\r\n"
    with pytest.raises(PatchError, match="edit 1: the search text matches more than once"):
        apply_edits("aaa", [{"search": "aa", "replace": "b"}])  # overlapping matches count


def test_apply_unified_diff_end_of_file_newlines() -> None:
    old = "one\ntwo"
    diff = "@@ -1,2 +1,2 @@\n one\n-two\n\\ No newline at end of file\n+TWO\n"
    assert apply_unified_diff(old, diff) == "one\nTWO\n"
    diff = "@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n\\ No newline at end of file\n"
    assert apply_unified_diff("one\ntwo\n", diff) == "one\nTWO"
    assert apply_unified_diff("", "@@ -0,0 +1,2 @@\n+a\n+b\n") == "a\nb\n"
    assert apply_unified_diff("a\r\nb\r\n", "@@ -1,2 +1,2 @@\n a\n-b\n+c\n") == "a\r\nc\r\n"
    with pytest.raises(PatchError, match="more than one file"):
        apply_unified_diff("a\n", "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="no hunks"):
        apply_unified_diff("a\n", "just words")


def test_resolve_path_refuses_an_allowed_root_that_escapes(tmp_path: Path) -> None:
    ws, outside = build_tree(tmp_path)
    (ws / "escape").symlink_to(outside)
    with pytest.raises(PathError) as info:
        resolve_path(ws, ["escape/"], "escape/secret.txt")
    assert info.value.code == "outside_roots" and "no usable allowed roots" in str(info.value)
    resolved = resolve_path(ws, ["", "notes/sub"], "notes/sub/b.md")
    assert (resolved.relative, resolved.root) == ("notes/sub/b.md", "notes/sub/")  # the deepest root
    resolved = resolve_path(ws, ["."], "private/secret.md")
    assert (resolved.relative, resolved.root) == ("private/secret.md", "")
