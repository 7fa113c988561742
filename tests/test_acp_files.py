"""ACP fs/read_text_file and fs/write_text_file through the gateway: only inside the run's
allowed roots, one receipt per call, `tool.*` events in the run (fake `fs` ACP agent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests._acp import WORKSPACE, FakeAcpPlugin, turn
from tests._harness import MakeGateway


async def files_gateway(make_gateway: MakeGateway, tmp_path: Path) -> tuple[Any, Path]:
    root = tmp_path / "workspace"
    (root / "notes").mkdir(parents=True)
    (root / "private").mkdir()
    (root / "notes" / "a.md").write_text("alpha\nbeta\n", encoding="utf-8")
    (root / "private" / "secret.md").write_text("do not read", encoding="utf-8")
    client = await make_gateway(
        overrides={"workspaces": {"roots": {WORKSPACE: str(root)}}}, extra_plugins=(FakeAcpPlugin("fs"),)
    )
    return client, root


def roots() -> dict[str, Any]:
    return {"context": {"allowedRoots": ["notes/"]}}


async def receipts(client: Any, run_id: str) -> list[dict[str, Any]]:
    return list((await (await client.get(f"/v1/runs/{run_id}/receipts")).json())["receipts"])


async def test_agent_reads_and_writes_inside_the_roots_with_receipts(make_gateway: MakeGateway, tmp_path: Path) -> None:
    client, root = await files_gateway(make_gateway, tmp_path)
    final, events = await turn(client, f"read {root / 'notes' / 'a.md'}", **roots())
    assert final["status"] == "completed"
    completed = next(e for e in events if e["kind"] == "message.completed")
    assert completed["payload"]["text"] == "read: alpha\nbeta\n"
    tool_events = [e for e in events if e["kind"].startswith("tool.") and e["source"] == "tool"]
    assert [e["kind"] for e in tool_events] == ["tool.started", "tool.completed"]
    [receipt] = await receipts(client, final["hostRunId"])
    assert receipt["allowed"] is True and receipt["tool"] == "fs.read_text_file" and receipt["path"] == "notes/a.md"
    assert receipt["caller"] == "acp.fs" and receipt["agentSessionId"] == final["providerRunId"]

    final, events = await turn(client, f"write {root / 'notes' / 'b.md'} written-by-agent", **roots())
    assert (root / "notes" / "b.md").read_text(encoding="utf-8") == "written-by-agent"
    [receipt] = await receipts(client, final["hostRunId"])
    assert receipt["allowed"] is True and receipt["diffSummary"]["created"] is True


async def test_agent_is_refused_outside_the_roots_and_nothing_is_written(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    client, root = await files_gateway(make_gateway, tmp_path)
    outside = tmp_path / "outside.md"
    for message in (
        f"read {root / 'private' / 'secret.md'}",  # inside the workspace, outside the run's roots
        "read /etc/hostname",
        f"write {outside} pwned",
        f"write {root / 'notes' / '..' / 'private' / 'x.md'} pwned",
    ):
        final, events = await turn(client, message, **roots())
        text = next(e for e in events if e["kind"] == "message.completed")["payload"]["text"]
        assert text.startswith("fs error:"), (message, text)
        assert "do not read" not in text
        [receipt] = await receipts(client, final["hostRunId"])
        assert receipt["allowed"] is False and receipt["reason"], receipt
    assert not outside.exists() and not (root / "private" / "x.md").exists()
