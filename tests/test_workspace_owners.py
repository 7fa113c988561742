"""`[workspaces] owners`: a workspace given to some actors is, for every other actor, a 404 — for
runs, for its `files.changed` stream, and for tool calls (the tool facade and plugin routes) — the
same answer as a workspace that does not exist. Without `owners`, every actor uses every workspace
as before. `config check` validates the ACL.

Two actors with tokens against a real gateway (aiohttp TestServer, SQLite, the fake upstream).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner

from agent_gateway import PluginRoutes, ToolError, hookimpl
from agent_gateway.cli import cli
from agent_gateway.config import Config
from tests._harness import WAIT, gateway_of, run_body, run_to_end

TOKENS = {"tok-alice-0123456789": "alice", "tok-bob-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-0123456789ab"}
NOTES, DOCS, SHARED = "local:notes", "team:docs", "shared"
OWNERS = {NOTES: ["alice"], DOCS: ["alice", "bob"]}


class OwnedArea:
    """A plugin whose routes reach workspaces: a tool call in the caller's run, and a lookup of a
    workspace the request names itself."""

    @hookimpl
    def register_routes(self, routes: PluginRoutes) -> None:
        async def write(request: web.Request) -> web.Response:
            run = await routes.run(request.match_info["hostRunId"], routes.actor(request))
            if run is None:
                return web.json_response({"error": {"code": "run_not_found", "message": "no such run"}}, status=404)
            try:
                result = await routes.call_tool("workspace.write_file", await request.json(), run)
            except ToolError as exc:
                return web.json_response({"error": exc.to_wire()}, status=400)
            return web.json_response(result)

        async def root(request: web.Request) -> web.Response:
            directory = routes.workspace_root(request, request.match_info["workspaceId"])
            return web.json_response({"configured": directory is not None})

        routes.add("POST", "/v1/owned/runs/{hostRunId}/write", write)
        routes.add("GET", "/v1/owned/workspaces/{workspaceId}", root)


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    made = {}
    for workspace_id in (NOTES, DOCS, SHARED):
        directory = tmp_path / workspace_id.replace(":", "-")
        (directory / "notes").mkdir(parents=True)
        made[workspace_id] = directory
    return made


def sections(dirs: dict[str, Path], owners: dict[str, list[str]] | None) -> dict[str, dict[str, Any]]:
    workspaces: dict[str, Any] = {"roots": {k: str(v) for k, v in dirs.items()}}
    if owners is not None:
        workspaces["owners"] = owners
    # Short heartbeats: an idle workspace stream answers (headers and a comment) quickly.
    return {"workspaces": workspaces, "gateway": {"heartbeat_seconds": 0.2}}


def body(workspace_id: str, message: str = "hi") -> dict[str, Any]:
    return run_body(message, workspaceId=workspace_id, context={"allowedRoots": ["notes"]})


async def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    error: dict[str, Any] = (await response.json())["error"]
    return error


async def stream_status(client: Any, workspace_id: str, headers: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    """The status of opening a workspace's event stream (and its JSON error, if refused)."""
    async with asyncio.timeout(WAIT):
        async with client.get(f"/v1/workspaces/{workspace_id}/events", headers=headers) as response:
            if response.status != 200:
                return response.status, (await response.json())["error"]
            assert response.content_type == "text/event-stream"
            return 200, None


async def test_runs_in_another_actors_workspace_are_404_like_a_missing_one(make_gateway, dirs) -> None:
    client = await make_gateway(tokens=TOKENS, overrides=sections(dirs, OWNERS))
    refused = await error_of(await client.post("/v1/runs", json=body(NOTES), headers=BOB), 404)
    missing = await error_of(await client.post("/v1/runs", json=body("no-such-ws"), headers=BOB), 404)
    assert refused["code"] == missing["code"] == "workspace_not_found"
    # The same answer whether the workspace is someone else's or does not exist at all.
    assert refused["message"].replace(NOTES, "?") == missing["message"].replace("no-such-ws", "?")
    assert refused.keys() == missing.keys()
    # Nothing was created for bob; alice is served in her workspace, bob in a shared one.
    assert gateway_of(client).runs.active_runs() == []
    receipt, events = await run_to_end(client, body(NOTES), headers=ALICE)
    assert (receipt["workspaceId"], events[-1]["event"]) == (NOTES, "run.completed")
    for workspace_id in (DOCS, SHARED):  # listed with bob, and not listed (everyone's)
        receipt, events = await run_to_end(client, body(workspace_id), headers=BOB)
        assert (receipt["actorId"], events[-1]["event"]) == ("bob", "run.completed")


async def test_without_owners_every_actor_uses_every_workspace(make_gateway, dirs) -> None:
    """Backwards compatible: no ACL configured, no run is refused for its workspace."""
    client = await make_gateway(tokens=TOKENS, overrides=sections(dirs, None))
    for workspace_id in (NOTES, "not-configured"):
        _, events = await run_to_end(client, body(workspace_id), headers=BOB)
        assert events[-1]["event"] == "run.completed"
    assert await stream_status(client, NOTES, BOB) == (200, None)


@pytest.mark.parametrize("owners", [OWNERS, None], ids=["owners", "no-owners"])
async def test_a_run_naming_no_workspace_runs_with_or_without_owners(make_gateway, dirs, owners) -> None:
    """A plain chat names no workspace: it runs for every actor, owners or not, with no workspace
    (its file tools say so), through the runs API and the OpenAI-compatible one alike."""
    client = await make_gateway(tokens=TOKENS, overrides=sections(dirs, owners))
    gateway = gateway_of(client)
    for headers, actor in ((ALICE, "alice"), (BOB, "bob")):
        plain = body(NOTES)
        del plain["workspaceId"], plain["context"]
        receipt, events = await run_to_end(client, plain, headers=headers)
        assert (receipt["workspaceId"], receipt["actorId"], events[-1]["event"]) == ("default", actor, "run.completed")
        await gateway.runs.wait(receipt["hostRunId"])  # past its end: the run's scope is the workspace's alone
        run = await gateway.runs.get(receipt["hostRunId"], actor)
        assert run is not None
        with pytest.raises(ToolError) as caught:
            await gateway.tools.call(
                "workspace.write_file", {"path": "a.md", "text": "x"}, gateway.tools.scope_for(run)
            )
        assert caught.value.code == "no_workspace" and "no directory configured" in caught.value.message
        described = await gateway.tools.call("workspace.describe_roots", {}, gateway.tools.scope_for(run))
        assert described["configured"] is False
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "chat-only", "messages": [{"role": "user", "content": "hi"}]},
            headers=headers,
        )
        assert response.status == 200, await response.text()
    # A workspace id that is not configured is still refused when owners are set.
    response = await client.post("/v1/runs", json=body("no-such-ws"), headers=BOB)
    assert response.status == (404 if owners else 201)


async def test_another_actors_workspace_stream_is_404(make_gateway, dirs) -> None:
    client = await make_gateway(tokens=TOKENS, overrides=sections(dirs, OWNERS))
    status, refused = await stream_status(client, NOTES, BOB)
    assert status == 404 and refused is not None and refused["code"] == "workspace_not_found"
    status, missing = await stream_status(client, "no-such-ws", BOB)
    assert status == 404 and missing is not None
    assert refused["message"].replace(NOTES, "?") == missing["message"].replace("no-such-ws", "?")
    assert await stream_status(client, NOTES, ALICE) == (200, None)
    assert await stream_status(client, DOCS, BOB) == (200, None)
    assert await stream_status(client, SHARED, BOB) == (200, None)


async def test_tool_calls_in_another_actors_workspace_are_refused(make_gateway, dirs, tmp_path) -> None:
    """Runs made before the workspace was given to alice: after a restart with the ACL, bob's old
    run reaches no file of it — through a plugin route (404) or the tool facade itself."""
    data_dir = tmp_path / "data"
    before = await make_gateway(
        tokens=TOKENS, overrides=sections(dirs, None), extra_plugins=(OwnedArea(),), data_dir=data_dir
    )
    bob_run, _ = await run_to_end(before, body(NOTES), headers=BOB)
    alice_run, _ = await run_to_end(before, body(NOTES), headers=ALICE)
    for ended in (bob_run, alice_run):  # past its terminal event: the run's own scope is gone too
        await gateway_of(before).runs.wait(ended["hostRunId"])
    write_path = f"/v1/owned/runs/{bob_run['hostRunId']}/write"
    # Without the ACL bob's run may write there (this is what the ACL takes away).
    first = await before.post(write_path, json={"path": "notes/bob-before.md", "text": "x"}, headers=BOB)
    assert first.status == 200, await first.text()
    await before.close()

    client = await make_gateway(
        tokens=TOKENS, overrides=sections(dirs, OWNERS), extra_plugins=(OwnedArea(),), data_dir=data_dir
    )
    target = dirs[NOTES] / "notes" / "bob.md"
    refused = await error_of(
        await client.post(write_path, json={"path": "notes/bob.md", "text": "x"}, headers=BOB), 404
    )
    assert refused["code"] == "workspace_not_found"
    assert not target.exists()
    served = await client.post(
        f"/v1/owned/runs/{alice_run['hostRunId']}/write", json={"path": "notes/alice.md", "text": "a"}, headers=ALICE
    )
    assert served.status == 200, await served.text()
    assert (dirs[NOTES] / "notes" / "alice.md").read_text() == "a"

    # The facade refuses whatever the caller (an agent's MCP call goes the same way), with a receipt.
    gateway = gateway_of(client)
    run = await gateway.runs.get(bob_run["hostRunId"], "bob")
    assert run is not None
    with pytest.raises(ToolError) as caught:
        await gateway.tools.call(
            "workspace.write_file", {"path": "notes/bob.md", "text": "x"}, gateway.tools.scope_for(run)
        )
    assert caught.value.code == "no_workspace" and caught.value.receipt_id
    assert not target.exists()
    receipts = await (await client.get(f"/v1/runs/{bob_run['hostRunId']}/receipts", headers=BOB)).json()
    assert [(r["allowed"], r["errorCode"]) for r in receipts["receipts"]][-1] == (False, "no_workspace")

    # A route naming a workspace itself gets the same 404 for another actor's or a missing one.
    assert (await error_of(await client.get(f"/v1/owned/workspaces/{NOTES}", headers=BOB), 404))["code"] == (
        "workspace_not_found"
    )
    assert (await client.get("/v1/owned/workspaces/nope", headers=BOB)).status == 404
    for workspace_id, headers in ((NOTES, ALICE), (DOCS, BOB), (SHARED, BOB)):
        response = await client.get(f"/v1/owned/workspaces/{workspace_id}", headers=headers)
        assert response.status == 200 and await response.json() == {"configured": True}


def test_config_check_validates_the_acl(tmp_path: Path, dirs: dict[str, Path]) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(
        f"""
[workspaces]
roots = {{ "local:notes" = "{dirs[NOTES]}", "team:docs" = "{dirs[DOCS]}" }}
owners = {{ "local:notes" = ["alice"], "ghost" = ["bob"], "team:docs" = "bob" }}
""",
        encoding="utf-8",
    )
    problems = Config.load(path, env={}).problems()
    assert problems == [
        f"{path}: workspaces.owners.ghost: 'ghost' is not a workspace in roots (known: local:notes, team:docs)",
        f'{path}: workspaces.owners.team:docs: must be a list of actor ids, e.g. ["alice", "bob"]',
    ]
    path.write_text('[workspaces]\nowners = { "x" = [] }\n', encoding="utf-8")
    assert Config.load(path, env={}).problems() == [
        f"{path}: workspaces.owners.x: 'x' is not a workspace in roots (known: none)",
        f"{path}: workspaces.owners.x: must name at least one actor (to close a workspace, remove it from roots)",
    ]
    path.write_text('[workspaces]\nowners = ["alice"]\n', encoding="utf-8")
    assert Config.load(path, env={}).problems() == [f"{path}: workspaces.owners: expected dict, got list"]
    # The launcher's check reports them the same way, and refuses a bad ACL from the environment.
    result = CliRunner().invoke(
        cli,
        ["config", "check"],
        env={
            "AGENT_GATEWAY_CONFIG": None,
            "AGENT_GATEWAY_LOAD_PLUGINS": "",
            "AGENT_GATEWAY__WORKSPACES__OWNERS": '{ "ghost" = [1] }',
        },
    )
    assert result.exit_code == 1
    assert "environment: workspaces.owners.ghost: 'ghost' is not a workspace in roots (known: none)" in result.output
    assert 'environment: workspaces.owners.ghost: must be a list of actor ids, e.g. ["alice", "bob"]' in result.output


async def test_knowledge_routes_refuse_another_actors_workspace(make_gateway, dirs) -> None:
    """The knowledge plugin's routes name a workspace in the request: Bob cannot list, add or
    query Alice's documents there (404, before the provider is asked)."""
    overrides = {**sections(dirs, OWNERS), "lightrag": {"url": "http://127.0.0.1:9"}}
    client = await make_gateway(tokens=TOKENS, overrides=overrides)
    listed = await client.get("/v1/knowledge/documents", params={"workspaceId": NOTES}, headers=BOB)
    assert (await error_of(listed, 404))["code"] == "workspace_not_found"
    query = {"workspaceId": NOTES, "query": "what is in the notes?"}
    asked = await client.post("/v1/knowledge/query", json=query, headers=BOB)
    assert (await error_of(asked, 404))["code"] == "workspace_not_found"
    # the owner gets past the check (the provider behind 127.0.0.1:9 is down: not a 404)
    allowed = await client.get("/v1/knowledge/documents", params={"workspaceId": NOTES}, headers=ALICE)
    assert allowed.status != 404, await allowed.text()
