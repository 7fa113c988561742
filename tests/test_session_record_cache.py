"""A run's start reads its session record on the loop (`get_session_nowait`): from what the
storage last read or wrote, else a SQLite point read. Every write and delete of the record is seen
by the next read, a read that spanned a write does not keep what it replaced, callers get their own
copies, and a clustered gateway always asks storage."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent_gateway import Run
from agent_gateway.hookspecs import hookimpl
from agent_gateway.plugins.journal_peewee import PeeweeStorage
from agent_gateway.plugins.journal_peewee.records import MAX_RECORD_CHARS
from agent_gateway.runtime import RuntimePolicy, Turn, TurnOutcome
from agent_gateway.storage import Storage
from tests._harness import gateway_of, run_to_end
from tests._sessions import ALICE, TOKENS, auth, body


@pytest.fixture
def storage(tmp_path: Path) -> Any:
    store = PeeweeStorage(f"sqlite:///{tmp_path / 'g.db'}")
    store.open()
    yield store
    store.close()


def test_writes_and_deletes_are_seen_by_the_next_read(storage: PeeweeStorage) -> None:
    assert storage.get_session_nowait("a", "s") is None  # no record: remembered as such
    storage.put_session("a", "s", {"turns": [1]})
    assert storage.get_session_nowait("a", "s") == {"turns": [1]}
    storage.put_session("a", "s", {"turns": [1, 2]})
    assert storage.get_session_nowait("a", "s") == {"turns": [1, 2]}
    assert storage.get_session_nowait("a", "other") is None
    storage.insert_run(Run("run-1", "q", "chat-only", "p", "s", "a", "w", status="completed"))
    assert storage.delete_session_history("a", "s")
    assert storage.get_session_nowait("a", "s") is None
    assert storage.get_session("a", "s") is None


def test_callers_get_their_own_copy(storage: PeeweeStorage) -> None:
    storage.put_session("a", "s", {"turns": [{"user": "hi"}]})
    first = storage.get_session_nowait("a", "s")
    assert first is not None
    first["turns"][0]["user"] = "changed"
    first["runtimes"] = {}
    assert storage.get_session_nowait("a", "s") == {"turns": [{"user": "hi"}]}


def test_a_read_that_spanned_a_write_keeps_nothing(storage: PeeweeStorage) -> None:
    records = storage._session_records
    storage.put_session("a", "s", {"v": 1})
    generation = records.generation  # a read starts here, finds v1 ...
    storage.put_session("a", "s", {"v": 2})  # ... a write commits meanwhile ...
    records.fill(("a", "s"), '{"v": 1}', generation)  # ... and the read ends: not kept
    assert storage.get_session_nowait("a", "s") == {"v": 2}


def test_retention_deleting_a_sessions_last_run_forgets_its_record(storage: PeeweeStorage) -> None:
    run = Run("run-1", "q", "chat-only", "p", "s", "a", "w", status="completed", updated_at=5)
    storage.insert_run(run)
    storage.put_session("a", "s", {"turns": [1]})
    assert storage.get_session_nowait("a", "s") == {"turns": [1]}
    assert storage.delete_run_history(run.host_run_id, before_ms=10)
    assert storage.get_session_nowait("a", "s") is None


def test_a_large_record_is_read_by_a_worker(storage: PeeweeStorage) -> None:
    big = {"turns": ["x" * MAX_RECORD_CHARS]}
    storage.put_session("a", "s", big)
    with pytest.raises(ValueError):
        storage.get_session_nowait("a", "s")
    assert storage.get_session("a", "s") == big


class HistoryRuntime:
    """Records each turn's session history and agent state; saves a state naming the run."""

    agent_id = "history"
    display_name = "History (tests)"
    provider = "tests"

    def __init__(self) -> None:
        self.policy = RuntimePolicy(context_carrier="none")
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def describe(self) -> dict[str, Any]:
        return {"capabilities": []}

    def can_delete_agent_session(self) -> bool:
        return True

    async def delete_agent_session(self, agent_session_id: str, state: dict[str, Any]) -> None:
        pass

    async def run_turn(self, turn: Turn) -> TurnOutcome:
        self.seen.append((len(turn.history), dict(turn.state)))
        await turn.save_state({"agentSessionId": f"agent-{turn.run.host_run_id}"})
        await turn.emit("message.completed", {"text": "ok"})
        return TurnOutcome("completed")

    async def close(self) -> None:
        pass


class HistoryPlugin:
    def __init__(self) -> None:
        self.runtime = HistoryRuntime()

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        register(self.runtime)


async def test_the_next_run_sees_the_sessions_writes_and_its_delete(
    make_gateway: Any, storage_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = HistoryPlugin()
    client = await make_gateway(storage=storage_kind, tokens=TOKENS, extra_plugins=(plugin,))
    seen = plugin.runtime.seen
    await run_to_end(client, body("s", "one", "r1", agent="history"), headers=auth(ALICE))
    await run_to_end(client, body("s", "two", "r2", agent="history"), headers=auth(ALICE))
    assert seen[0] == (0, {}) and seen[1][0] == 1 and seen[1][1]["agentSessionId"].startswith("agent-")
    # The agent session's delete writes the record: the next run has no agent state.
    response = await client.delete("/v1/sessions/s/agent-session", headers=auth(ALICE))
    assert response.status == 200, await response.text()
    await run_to_end(client, body("s", "three", "r3", agent="history"), headers=auth(ALICE))
    assert seen[2] == (2, {})
    # The session's delete removes the record: the next run starts with no history.
    assert (await client.delete("/v1/sessions/s", headers=auth(ALICE))).status == 200
    await run_to_end(client, body("s", "four", "r4", agent="history"), headers=auth(ALICE))
    assert seen[3] == (0, {})
    # A clustered gateway (another instance may write the record) always asks a worker.
    runs = gateway_of(client).runs
    storage: Storage = gateway_of(client).storage
    storage.put_session("alice", "t", {"turns": [{"user": "u"}]})
    run: Any = SimpleNamespace(actor_id="alice", session_id="t")
    assert await runs._session_record(run) == {"turns": [{"user": "u"}]}

    def not_on_the_loop(*key: str) -> None:
        raise AssertionError("read on the loop while clustered")

    monkeypatch.setattr(storage, "get_session_nowait", not_on_the_loop, raising=False)
    monkeypatch.setattr(runs.coordinator, "clustered", True)
    assert await runs._session_record(run) == {"turns": [{"user": "u"}]}
