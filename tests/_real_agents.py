"""Helpers for tests against the real agent peers (Reasonix, Hermes): their binaries, a
scripted fake LLM, and a conversation through the HTTP API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent_gateway.testing.fake_openai import FakeOpenAI, Reply
from tests._harness import require_mark

BINARIES = {"reasonix": ("REASONIX_BIN", "reasonix"), "hermes": ("HERMES_ACP_BIN", "hermes-acp")}


# Hermes needs a few seconds to start, open a session and warm up its tools: one turn may take long.
TURN_TIMEOUT = 90.0


# A reply long enough to be cut off mid-stream: ~400 chunks, 50 ms apart (~20 s if never stopped).
LONG_REPLY = Reply(text="".join(f"w{i:03d} " for i in range(400)), chunk_size=5, delay=0.05)


def peers_dir() -> Path:
    return Path(os.environ.get("AGENT_GATEWAY_PEERS_DIR") or Path.home() / ".cache" / "agent-gateway" / "peers")


def agent_binary(agent: str) -> str:
    require_mark("peers", f"the real {agent}")
    variable, name = BINARIES[agent]
    path = os.environ.get(variable) or str(peers_dir() / "bin" / name)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(
            f"{agent}: no executable at {path} ({variable} unset or wrong). Install the real peers with "
            "`bash contrib/peers/install.sh` (or run contrib/dev/test-all.sh, which does and exports "
            f"{variable}).",
            pytrace=False,
        )
    return path


def message_text(content: Any) -> str:
    """Text of an OpenAI chat message `content` (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


class Llm:
    """Answers the agents' LLM calls by the last user message (a FIFO would be consumed by the
    agents' side calls: Hermes' title generation, ...)."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.answers: dict[str, Reply] = {}
        fake.default = self

    def __call__(self, body: dict[str, Any]) -> Reply:
        text = last_user_text(body)
        if not body.get("stream"):  # Hermes' title generation and the like
            return Reply(text="A short test conversation")
        for trigger, reply in self.answers.items():
            if text.strip().endswith(trigger):
                return reply
        return Reply(text=f"Answer to: {text.strip()[-60:]}")

    def turn_requests(self, message: str) -> list[dict[str, Any]]:
        """The streamed chat requests whose last user message is (ends with) `message`."""
        return [r for r in self.fake.requests if r.get("stream") and last_user_text(r).strip().endswith(message)]


def overrides(agent: str, base_url: str, home: Path) -> dict[str, dict[str, Any]]:
    binary = agent_binary(agent)
    if agent == "reasonix":
        section: dict[str, Any] = {
            "command": [binary, "acp"],
            "env": {"HOME": str(home)},
            "provider_base_url": base_url,
            "provider_model": "m",
        }
    else:
        section = {
            "command": [binary],
            "env": {"HOME": str(home)},
            "hermes_home": str(home / "hermes"),
            "provider_base_url": base_url,
            "provider_model": "m",
        }
    # Only the agent under test: the other one must not start (or be looked for).
    other = "hermes" if agent == "reasonix" else "reasonix"
    return {agent: section, other: {"enabled": False}}


def conversation(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(m.get("role")), message_text(m.get("content"))) for m in body.get("messages") or []]
