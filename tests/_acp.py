"""Helpers for tests of the ACP runtime: a fake-ACP-agent plugin, its workspace and one turn through it."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.hookspecs import hookimpl
from tests._harness import FAKE_ACP_AGENT, run_to_end

REPO_ROOT = Path(__file__).resolve().parent.parent


AGENT = "fake-acp"


WORKSPACE = "local:test"


class FakeAcpPlugin:
    """Registers one AcpRuntime for a fake ACP agent behaviour (it carries the ACP session
    strategy itself: no `session_strategy` hook needed)."""

    def __init__(
        self,
        behaviour: str,
        *,
        agent_id: str = AGENT,
        delay: float = 0.0,
        state_dir: Path | None = None,
        **spec: Any,
    ) -> None:
        self.behaviour = behaviour
        self.agent_id = agent_id
        self.env = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "FAKE_ACP_DELAY": str(delay),
            "FAKE_ACP_STATE_DIR": str(state_dir) if state_dir is not None else "",
        }
        # The agent keeps its sessions there: a folder it may write from its sandbox.
        self.spec = {"writable": [state_dir]} if state_dir is not None else {}
        self.spec.update(spec)
        self.runtime: AcpRuntime | None = None

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", self.behaviour]
        spec = AcpAgentSpec(
            self.agent_id, f"Fake ACP ({self.behaviour})", "fake-acp", command, env=self.env, **self.spec
        )
        self.runtime = AcpRuntime(spec)
        register(self.runtime)


def body(message: str, session: str = "s1", agent_id: str = AGENT, **fields: Any) -> dict[str, Any]:
    run = {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": agent_id,
        "sessionId": session,
        "workspaceId": WORKSPACE,
        "message": message,
    }
    run.update(fields)
    return run


async def receipt(client: TestClient, run_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{run_id}")
    assert response.status == 200, await response.text()
    return dict(await response.json())


async def turn(
    client: TestClient, message: str, session: str = "s1", **fields: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run to its end through the SSE stream: (final receipt, event dicts of the journal)."""
    created, events = await run_to_end(client, body(message, session, **fields))
    return await receipt(client, created["hostRunId"]), [e["data"] for e in events]
