"""Helpers for the workspace tool tests: a harness running tools on a temporary workspace
(the fixtures `make_harness` and `h`) and a recorder of tool calls."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import agent_gateway.plugins.workspace as workspace_plugin
from agent_gateway.bus import Bus
from agent_gateway.config import Config, section_specs_from_hook
from agent_gateway.hookspecs import hookimpl
from agent_gateway.journal import Journal
from agent_gateway.models import Run
from agent_gateway.plugin_host import PluginHost
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.tools import RunScope, ToolCall, ToolError, ToolFacade

PAGE = "notes/today.md"


PAGE_TEXT = "# Today\n\nline one\nline two\nline three\n"


SELECTION = {"text": "line two", "from": 19, "to": 27}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Harness:
    tmp: Path
    ws: Path
    outside: Path
    storage: PeeweeStorage
    journal: Journal
    facade: ToolFacade
    run: Run
    scope: RunScope
    executor: ThreadPoolExecutor
    plugins: PluginHost
    extra: dict[str, Any] = field(default_factory=dict)

    async def call(self, name: str, arguments: Any, scope: RunScope | None = None) -> dict[str, Any]:
        return await self.facade.call(name, arguments, scope or self.scope, caller="test")

    async def refused(self, name: str, arguments: Any, code: str, scope: RunScope | None = None) -> ToolError:
        with pytest.raises(ToolError) as info:
            await self.call(name, arguments, scope)
        assert info.value.code == code, (info.value.code, info.value.message)
        assert info.value.message
        assert info.value.receipt_id
        return info.value

    def receipts(self) -> list[dict[str, Any]]:
        return self.storage.list_receipts(self.run.host_run_id)

    async def events(self) -> list[Any]:
        return [e for e in await self.journal.read(self.run.host_run_id) if e.kind.startswith("tool.")]


def build_tree(tmp: Path) -> tuple[Path, Path]:
    ws = tmp / "ws"
    (ws / "notes" / "sub").mkdir(parents=True)
    (ws / "private").mkdir()
    (ws / PAGE).write_text(PAGE_TEXT)
    (ws / "notes" / "a.md").write_text("alpha\nbeta\ngamma\n")
    (ws / "notes" / "sub" / "b.md").write_text("inside b\n")
    (ws / "private" / "secret.md").write_text("workspace secret, not in the allowed roots\n")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside secret\n")
    (outside / "b.md").write_text("outside b\n")
    return ws, outside


HarnessFactory = Callable[..., Awaitable[Harness]]


@pytest.fixture(name="make_harness")
async def make_harness_fixture(tmp_path: Path) -> AsyncIterator[HarnessFactory]:
    made: list[Harness] = []

    async def factory(
        *,
        extra_plugins: tuple[object, ...] = (),
        allowed_roots: list[str] | None = None,
        target: dict[str, Any] | None = None,
        workspace_tools: dict[str, Any] | None = None,
        configure_workspace: bool = True,
    ) -> Harness:
        base = tmp_path / f"h{len(made)}"
        base.mkdir()
        ws, outside = build_tree(base)
        (base / "db").mkdir()
        storage = PeeweeStorage(f"sqlite:///{base / 'db' / 'gateway.db'}")
        storage.open()
        journal = Journal(storage, Bus(), None)
        await journal.start()
        plugins = PluginHost.load(env={}, builtins={"core", "journal_peewee"}, extra=(workspace_plugin, *extra_plugins))
        overrides: dict[str, dict[str, Any]] = {"gateway": {"data_dir": str(base / "db")}}
        if configure_workspace:
            overrides["workspaces"] = {"roots": {"ws1": str(ws)}}
        if workspace_tools:
            overrides["workspace_tools"] = workspace_tools
        config = Config.load(None, env={}, overrides=overrides)
        for spec in section_specs_from_hook(plugins.config_sections()):
            config.add_section(spec)
        assert config.problems() == []
        executor = ThreadPoolExecutor(2, thread_name_prefix="tools-test")
        facade = ToolFacade(
            plugins.tools(config), plugins, storage, executor, journal, workspace_roots=config.workspace_roots
        )
        context = {
            "target": {"path": PAGE, "selection": SELECTION} if target is None else target,
            "allowedRoots": ["notes/"] if allowed_roots is None else allowed_roots,
        }
        run = Run(
            host_run_id=f"run_test{len(made)}",
            request_id="req-1",
            agent_id="pi-lab",
            provider="pi",
            session_id="s-1",
            actor_id="alice",
            workspace_id="ws1",
            target_snapshot_hash="target-hash",
            request={"message": "hi", "context": context, "options": {"model": "model-x"}},
        )
        storage.insert_run(run)
        journal.open_run(run.host_run_id)
        scope = facade.scope_for(run, agent_session_id="agent-sess-1")
        harness = Harness(base, ws, outside, storage, journal, facade, run, scope, executor, plugins)
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        await asyncio.wait_for(harness.journal.close(), 20)  # bounded: a stuck journal fails, not hangs
        harness.storage.close()
        harness.executor.shutdown(wait=True)


@pytest.fixture(name="h")
async def h_fixture(make_harness: HarnessFactory) -> Harness:
    return await make_harness()


class Recorder:
    """A policy plugin: records veto calls and completions; refuses what `refuse` says."""

    def __init__(self, refuse: Callable[[ToolCall], str | None] = lambda call: None) -> None:
        self.refuse = refuse
        self.vetoed: list[tuple[str, dict[str, str]]] = []
        self.completed: list[dict[str, Any]] = []

    @hookimpl
    def tool_call_veto(self, call: ToolCall) -> str | None:
        self.vetoed.append((call.name, {k: p.relative for k, p in call.paths.items()}))
        return self.refuse(call)

    @hookimpl
    def tool_call_completed(self, call: ToolCall, receipt: dict[str, Any]) -> None:
        self.completed.append(receipt)
