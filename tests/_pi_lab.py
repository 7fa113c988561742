"""Helpers for tests of the Pi runtime (pi_lab): its binary, configuration and run bodies."""

from __future__ import annotations

import os
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

import agent_gateway.plugins.pi_lab
from agent_gateway.testing.fake_openai import FakeOpenAI
from tests._harness import MakeGateway, require_mark


def pi_binary() -> str:
    require_mark("peers", "the real Pi")
    peers = Path(os.environ.get("AGENT_GATEWAY_PEERS_DIR") or Path.home() / ".cache" / "agent-gateway" / "peers")
    path = os.environ.get("PI_BIN") or str(peers / "bin" / "pi")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(
            f"pi-lab: no executable Pi at {path} (PI_BIN unset or wrong). Install the real peers with "
            "`bash contrib/peers/install.sh` (it installs @earendil-works/pi-coding-agent and Node 22).",
            pytrace=False,
        )
    return path


def _extra_plugins() -> tuple[object, ...]:
    """pi_lab itself, unless the installed entry points already load it."""
    loaded = any(ep.name == "pi_lab" for ep in metadata.entry_points(group="agent_gateway"))
    return () if loaded else (agent_gateway.plugins.pi_lab,)


def pi_overrides(fake: FakeOpenAI, home: Path, **extra: Any) -> dict[str, dict[str, Any]]:
    section = {
        "command": [pi_binary()],
        "env": {"HOME": str(home)},  # anything Pi would put in ~ stays in the test
        "provider_base_url": fake.base_url,
        "provider_model": "m",
        **extra,
    }
    return {"pi_lab": section, "reasonix": {"enabled": False}, "hermes": {"enabled": False}}


async def start(make_gateway: MakeGateway, fake: FakeOpenAI, home: Path, **kw: Any) -> TestClient:
    return await make_gateway(
        overrides=pi_overrides(fake, home, **kw.pop("section", {})), extra_plugins=_extra_plugins(), **kw
    )


def body(session_id: str, message: str, workspace: str = "local:test", **fields: Any) -> dict[str, Any]:
    return {
        "requestId": "req-" + uuid.uuid4().hex[:10],
        "agentId": "pi-lab",
        "sessionId": session_id,
        "workspaceId": workspace,
        "message": message,
        **fields,
    }
