"""Agent environments are explicit: an agent process gets the base agent environment, what its
runtime needs and its section's `env`, not the gateway's whole environment (`inherit_env = true`
opts in to it).

The helper (`agent_gateway.agent_environment`) on its own, and the real Pi (`pi --mode rpc`, in an
in-process gateway whose environment is this process's) read back through `/proc/<pid>/environ`.
ACP agents are checked the same way in tests/test_acp_agents_config.py, behind a real
`agent-gateway serve`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from agent_gateway import agent_environment
from agent_gateway.plugins.pi_lab.runtime import PiRuntime
from agent_gateway.testing.fake_openai import FakeOpenAI
from tests._harness import MakeGateway, gateway_of, run_to_end

SECRET_NAME = "AGENT_GATEWAY_TEST_SECRET"
SECRET = "s3cret-" + uuid.uuid4().hex


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


# -- the helper ----------------------------------------------------------------------------------------------


def test_agent_environment_keeps_the_base_drops_the_rest_and_adds_the_section() -> None:
    source = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LC_TIME": "C",
        "LANG": "C.UTF-8",
        "OPENAI_API_KEY": "sk-gateway",
        "DATABASE_URL": "postgresql://secret",
    }
    env = agent_environment({"OPENAI_API_KEY": "sk-agent", "HOME": "/agent-home"}, source=source)
    assert env == {
        "PATH": "/bin",
        "HOME": "/agent-home",
        "LC_TIME": "C",
        "LANG": "C.UTF-8",
        "OPENAI_API_KEY": "sk-agent",
    }
    assert agent_environment({"X": "1"}, inherit=True, source=source) == {**source, "X": "1"}


# -- Pi --------------------------------------------------------------------------------------------------------


@pytest.mark.peers
@pytest.mark.parametrize("inherit", [False, True], ids=["base", "inherit_env"])
async def test_pi_gets_the_base_environment_its_section_env_and_its_own_variables(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inherit: bool
) -> None:
    from tests._pi_lab import body as pi_body
    from tests._pi_lab import start as start_pi

    monkeypatch.setenv(SECRET_NAME, SECRET)  # the gateway's environment (it runs in this process)
    home = tmp_path / "pi-home"
    home.mkdir()
    client = await start_pi(
        make_gateway, fake_llm, home, section={"inherit_env": inherit, "env": {"HOME": str(home), "SECTION_ONLY": "pi"}}
    )
    _, events = await run_to_end(client, pi_body("s-env", "hello"), timeout=60.0)
    assert events[-1]["event"] == "run.completed", events[-1]
    runtime = gateway_of(client).runtimes["pi-lab"]
    assert isinstance(runtime, PiRuntime)
    [binding] = runtime.bindings.values()
    pid = binding.process.pid
    assert pid is not None
    environ = environ_of(pid)
    # HOME is the agent's per-actor home whatever the section says: nothing it keeps crosses actors.
    agent_home = gateway_of(client).sandbox.home_for("pi-lab", "local")
    assert (environ["SECTION_ONLY"], environ["HOME"], environ["PI_OFFLINE"]) == ("pi", str(agent_home), "1")
    assert environ["PATH"] == os.environ["PATH"]
    if inherit:
        assert environ[SECRET_NAME] == SECRET
    else:
        assert SECRET_NAME not in environ and SECRET not in "".join(environ.values())
