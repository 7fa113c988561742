"""Where an ACP agent's version comes from, and that a descriptor never waits on an agent process.

The agent here is a fake ACP agent (`contrib/fake_acp_agents`) behind a launcher script, declared
by configuration (`[acp_agents.<id>]`): the script is the command's first word, so the gateway may
probe it with `--version`. The fake ignores `--version` (it stays an ACP agent), notes every start
(`FAKE_ACP_STARTED`: pid, argv, whether stdin is /dev/null) and, started with `--version`, blocks
on a FIFO (`FAKE_ACP_HOLD`) until the test releases it. Every wait is bounded; nothing sleeps to
synchronise (waiting for the start note polls a file, bounded by `WAIT`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

import agent_gateway.acp.runtime as acp_runtime
from tests._harness import FAKE_ACP_AGENT, WAIT, MakeGateway, run_to_end

REPO_ROOT = Path(__file__).resolve().parent.parent
# A descriptor that waited on the probe would take the probe's whole timeout (raised to 3 × WAIT
# here, and the probe only ends when the test releases it): anything under WAIT did not wait. Not
# a speed figure: a busy machine (two test workers and a CPU burner on two cores) took 2.3 s.
FAST = WAIT


def acp_agent(agent_id: str, table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Gateway overrides declaring one `[acp_agents.<agent_id>]` table. The agents here run
    unconfined: these tests read the agent's own pid and argv (FAKE_ACP_STARTED), which a
    sandbox's PID namespace renumbers."""
    return {
        "acp_agents": {f"{agent_id}__{key}": value for key, value in table.items()},
        "sandbox": {"mode": "off"},
    }


def starts(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def descriptor(client: TestClient, agent_id: str) -> tuple[dict[str, Any], float]:
    """(the agent's descriptor, seconds it took)."""
    began = time.monotonic()
    response = await client.get(f"/v1/agents/{agent_id}")
    assert response.status == 200, await response.text()
    return dict(await response.json()), time.monotonic() - began


async def first_turn(client: TestClient, agent_id: str) -> None:
    body = {"requestId": "req-1", "agentId": agent_id, "sessionId": "s1", "workspaceId": "local:test", "message": "hi"}
    _, events = await run_to_end(client, body)
    assert events[-1]["data"]["kind"] == "run.completed", [e["data"]["kind"] for e in events]


async def test_descriptor_never_waits_on_a_version_probe_and_initialize_gives_the_version(
    make_gateway: MakeGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the release ends the probe, so "answered while the probe was blocked" is certain.
    monkeypatch.setattr(acp_runtime, "PROBE_TIMEOUT", WAIT * 3)
    launcher = tmp_path / "fake-agent"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_ACP_AGENT}" --behaviour basic "$@"\n')
    launcher.chmod(0o755)
    started, hold = tmp_path / "started.jsonl", tmp_path / "hold.fifo"
    os.mkfifo(hold)
    section = {
        "command": [str(launcher)],
        # Only the section's environment carries these: the probe sees them or never blocks.
        "env": {"FAKE_ACP_STARTED": str(started), "FAKE_ACP_HOLD": str(hold), "PYTHONPATH": str(REPO_ROOT)},
    }
    client = await make_gateway(acp_agent("slow-version", section))

    found, took = await descriptor(client, "slow-version")
    assert took < FAST, took
    assert found["availability"]["available"] is True, found["availability"]
    assert found["availability"]["version"] is None  # not known yet, and not waited for

    # Opening the FIFO for writing returns once the probe holds it open for reading: the probe has
    # started (in the background, with the section's environment) and is blocked.
    opening = asyncio.ensure_future(asyncio.to_thread(open, hold, "wb"))
    try:
        async with asyncio.timeout(WAIT):
            writer = await asyncio.shield(opening)
    except TimeoutError:
        os.close(os.open(hold, os.O_RDONLY | os.O_NONBLOCK))  # let the opening thread end
        raise AssertionError(f"the version probe never started: {starts(started)}") from None
    with writer:
        (probe,) = starts(started)
        assert probe["argv"][-1] == "--version" and probe["stdinIsDevNull"] is True, probe
        for _ in range(3):  # every call answers at once while the probe is still blocked
            found, took = await descriptor(client, "slow-version")
            assert took < FAST, took
            assert found["availability"]["version"] is None
            os.kill(probe["pid"], 0)  # still running (blocked on the FIFO)
        listing = await client.get("/v1/agents")
        assert listing.status == 200
    # Released: the probe reads end-of-file, then serves ACP on /dev/null, which ends at once.

    await first_turn(client, "slow-version")
    found, took = await descriptor(client, "slow-version")
    assert took < FAST, took
    availability = found["availability"]
    assert availability["version"] == "0.1" and availability["versionSource"] == "initialize", availability
    assert availability["agentInfo"] == {"name": "fake-acp-basic", "title": "Fake ACP agent", "version": "0.1"}
    # Probed once, however many descriptors were asked for: the other start is the turn's agent.
    assert [s["argv"][-1] == "--version" for s in starts(started)] == [True, False]


async def test_an_interpreter_is_never_probed(make_gateway: MakeGateway, tmp_path: Path) -> None:
    """`command = ["python3", "agent.py"]`: `python3 --version` would be the interpreter's."""
    started = tmp_path / "started.jsonl"
    section = {
        "command": [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"],
        "env": {"FAKE_ACP_STARTED": str(started), "PYTHONPATH": str(REPO_ROOT)},
    }
    client = await make_gateway(acp_agent("py-agent", section))
    for _ in range(2):
        found, took = await descriptor(client, "py-agent")
        assert took < FAST, took
        assert found["availability"]["version"] is None, found["availability"]
    assert not starts(started)
    await first_turn(client, "py-agent")
    found, _ = await descriptor(client, "py-agent")
    assert found["availability"]["version"] == "0.1" and found["availability"]["versionSource"] == "initialize"
    assert len(starts(started)) == 1


def test_probe_version_reads_the_binary_itself(tmp_path: Path) -> None:
    """A binary that answers `--version` is probed with stdin closed and its first line kept; a
    line without a digit (a log line) is no version."""
    binary = tmp_path / "my-agent"
    binary.write_text('#!/bin/sh\n[ "$1" = --version ] && read -r line; echo "my-agent 2.5.0 ($line)"\n')
    binary.chmod(0o755)
    assert acp_runtime.probe_version([str(binary)], env={"PATH": "/usr/bin:/bin"}) == "my-agent 2.5.0 ()"
    chatty = tmp_path / "chatty-agent"
    chatty.write_text("#!/bin/sh\necho 'starting the agent...' >&2\n")
    chatty.chmod(0o755)
    assert acp_runtime.probe_version([str(chatty)], env={"PATH": "/usr/bin:/bin"}) is None
    assert acp_runtime.probes_itself([str(binary), "acp"])
    assert not acp_runtime.probes_itself(["python3", "agent.py"])
    assert not acp_runtime.probes_itself(["/usr/bin/node", "cli.js"])
    assert not acp_runtime.probes_itself(["npx", "some-agent"])
