"""Helpers for the OpenAI-compatible tests: the fake ACP agent's plugin and an SDK client."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import openai
from aiohttp.test_utils import TestClient

from agent_gateway import AcpAgentSpec, AcpRuntime, hookimpl
from tests._harness import FAKE_ACP_AGENT, WAIT

REPO_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "tok-openai-alice"
ACP_AGENT = "fake-acp"
AGENTS = ("chat-only", ACP_AGENT)


class FakeAcpPlugin:
    """Registers the fake ACP agent (behaviour ``basic``; ``flood N`` with ``--behaviour flood``)."""

    def __init__(self, behaviour: str = "basic", delay: float = 0.0) -> None:
        self.behaviour = behaviour
        self.env = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "FAKE_ACP_DELAY": str(delay),
        }

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        command = [sys.executable, FAKE_ACP_AGENT, "--behaviour", self.behaviour]
        register(AcpRuntime(AcpAgentSpec(ACP_AGENT, "Fake ACP", "fake-acp", command, env=self.env)))


async def sdk_for(client: TestClient, token: str = TOKEN, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=str(client.make_url("/v1")), api_key=token, max_retries=0, timeout=WAIT, **options
    )
