"""Helpers for the sessions API tests: a transcript-writing test runtime, two actors, run bodies."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_gateway.hookspecs import hookimpl
from agent_gateway.routes.sessions import SessionIndexer
from agent_gateway.runtime import RuntimePolicy, Turn, TurnOutcome
from tests._harness import gateway_of

ALICE, BOB = "tok-alice-0123456789", "tok-bob-000123456789"


def body(session: str, message: str, request: str, agent: str = "transcript", **options: Any) -> dict[str, Any]:
    return {
        "requestId": request,
        "agentId": agent,
        "sessionId": session,
        "workspaceId": "w",
        "message": message,
        "options": options,
    }


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def get_json(client: Any, path: str, token: str = ALICE, expect: int = 200, **params: Any) -> Any:
    response = await client.get(path, params=params, headers=auth(token))
    data = await response.json()
    assert response.status == expect, data
    return data


TOKENS = {ALICE: "alice", BOB: "bob"}


class TranscriptRuntime:
    """Emits what a real agent turn does: a mode, thoughts, a tool call with a citation, a plan,
    a changed file, replayed history, answer deltas and the final answer. ``options.hold``: wait
    for ``release`` before answering."""

    agent_id = "transcript"
    display_name = "Transcript (tests)"
    provider = "tests"

    def __init__(self, deletable: bool = False) -> None:
        self.policy = RuntimePolicy(context_carrier="none")
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.deleted: list[tuple[str, dict[str, Any]]] = []
        self.deletable = deletable
        if deletable:
            self.agent_id = "deletable"

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    def can_delete_agent_session(self) -> bool:
        return self.deletable

    async def delete_agent_session(self, agent_session_id: str, state: dict[str, Any]) -> None:
        self.deleted.append((agent_session_id, state))

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        agent_session = turn.state.get("agentSessionId") or f"agent-{turn.run.session_id}"
        mode = "native_live" if turn.state.get("agentSessionId") else "new_session"
        await turn.save_state({"agentSessionId": agent_session})
        await turn.set_session_mode(mode, {"agentSessionId": agent_session})
        await turn.emit("replay.message", {"role": "assistant", "text": "OLD REPLAYED"}, source="adapter_replay")
        await turn.emit("thought.delta", {"text": "secret pondering"})
        await turn.emit("tool.started", {"toolCallId": "c1", "title": "search the guide", "kind": "search"})
        citation = {"citationMarkdown": "[guide.md](agent-gateway://workspace/w/guide.md)", "path": "docs/guide.md"}
        await turn.emit(
            "tool.completed",
            {"toolCallId": "c1", "status": "completed", "receiptId": "rcpt_1", "rawOutput": {"references": [citation]}},
        )
        await turn.emit("plan.updated", {"entries": [{"content": "answer", "status": "completed"}]})
        await turn.emit("files.changed", {"changes": [{"path": "notes/summary.txt"}]})
        if turn.options.get("hold"):
            await turn.emit("plan.updated", {"entries": [{"content": "waiting", "status": "in_progress"}]})
            self.holding.set()
            await self.release.wait()
        answer = f"Here is about {turn.message}"
        await turn.emit("message.delta", {"text": answer[:5]})
        await turn.emit("message.delta", {"text": answer[5:]})
        await turn.emit("message.completed", {"text": answer})
        return TurnOutcome("completed")

    async def close(self) -> None:
        pass


class TranscriptPlugin:
    def __init__(self) -> None:
        self.runtime = TranscriptRuntime()
        self.deletable = TranscriptRuntime(deletable=True)

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(self.runtime)
        register(self.deletable)


async def gateway(make_gateway: Any, storage_kind: str) -> tuple[Any, TranscriptPlugin]:
    plugin = TranscriptPlugin()
    client = await make_gateway(storage=storage_kind, tokens=TOKENS, extra_plugins=(plugin,))
    return client, plugin


def indexer_of(client: Any) -> SessionIndexer:
    """The gateway's session indexer (a run listener)."""
    [indexer] = [
        listener.__self__
        for listener in gateway_of(client).runs.listeners
        if isinstance(getattr(listener, "__self__", None), SessionIndexer)
    ]
    return indexer


def watch_index_batches(monkeypatch: Any, indexer: SessionIndexer) -> list[list[tuple[Any, Any]]]:
    """Every batch of (run snapshot, source) the indexer indexes from now on, on either path (a
    storage worker or the journal's writer)."""
    batches: list[list[tuple[Any, Any]]] = []
    index_writes = indexer._index_writes

    def watched(batch: list[tuple[Any, Any]]) -> list[Any]:
        batches.append(list(batch))
        return index_writes(batch)

    monkeypatch.setattr(indexer, "_index_writes", watched)
    return batches
