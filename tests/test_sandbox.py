"""Agent processes are confined (`[sandbox]`, the `sandbox_agent` hook, bubblewrap built in).

An agent is treated as hostile: the fake ACP agent's ``probe <json>`` prompt makes it try, with its
own powers (not the gateway's tools), what a prompt injection would ask — read another actor's
workspace, a secret outside every workspace, the gateway's data directory and its process
environment; write outside its allowed roots; connect to the gateway's HTTP API, PostgreSQL, Redis
and a metadata address — and reply with what each attempt gave. Everything here runs real
processes in a real bubblewrap sandbox, against a real gateway (aiohttp TestServer, SQLite).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway import AgentLaunch, SandboxedCommand
from agent_gateway.acp.runtime import AcpAgentSpec, AcpRuntime
from agent_gateway.hookspecs import hookimpl
from agent_gateway.sandbox import bubblewrap
from agent_gateway.testing.fake_openai import FakeOpenAI
from tests._harness import FAKE_ACP_AGENT, WAIT, MakeGateway, gateway_of, run_body, run_to_end

AGENT = "probe-agent"
TOKENS = {"tok-alice-0123456789": "alice", "tok-bob-0123456789ab": "bob"}
ALICE = {"Authorization": "Bearer tok-alice-0123456789"}
BOB = {"Authorization": "Bearer tok-bob-0123456789ab"}
SECRET_ENV = "AGW_SANDBOX_TEST_PROVIDER_KEY"
SECRET_VALUE = "sk-gateway-only-7f3a9c"

pytestmark = pytest.mark.skipif(
    bubblewrap.probe() is not None, reason=f"bubblewrap cannot run here: {bubblewrap.probe()}"
)


class ProbeAgent:
    """The fake ACP agent as a runtime plugin, allowed to reach the fake upstream (its "model")."""

    def __init__(self, upstream: str, **spec: Any) -> None:
        self.upstream = upstream
        self.spec = spec

    @hookimpl
    def register_runtimes(self, register: Any, config: Any) -> None:
        host, _, port = self.upstream.removeprefix("http://").split("/")[0].partition(":")
        spec = AcpAgentSpec(
            AGENT,
            "Probe",
            "tests",
            [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"],
            network=[(host, int(port))],
            session_timeout=WAIT,
            **self.spec,
        )
        register(AcpRuntime(spec))


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """Two actors' workspaces, a secret outside every workspace."""
    made: dict[str, Path] = {}
    for name in ("wsA", "wsB"):
        notes = tmp_path / name / "notes"
        notes.mkdir(parents=True)
        (notes / "today.md").write_text(f"{name} notes", encoding="utf-8")
        (tmp_path / name / "private.md").write_text(f"{name} outside its allowed root", encoding="utf-8")
        # The agent runs as an unprivileged user where the tests run as root: the allowed root
        # is the folder it may write.
        notes.chmod(0o777)
        made[name] = tmp_path / name
    (tmp_path / "secret.txt").write_text("the outside secret", encoding="utf-8")
    made["secret"] = tmp_path / "secret.txt"
    # what a gateway's config file holds: actors' tokens
    (tmp_path / "gateway.toml").write_text(f"[auth]\ntokens = {TOKENS!r}\n".replace("'", '"'), encoding="utf-8")
    made["config"] = tmp_path / "gateway.toml"
    return made


async def gateway(
    make_gateway: MakeGateway, world: dict[str, Path], upstream: FakeOpenAI, **sandbox: Any
) -> TestClient:
    """Two actors, their workspaces, and the probe agent declared by configuration alone (an
    `[acp_agents.probe-agent]` table) with the fake upstream as its model endpoint."""
    overrides = {
        "workspaces": {
            "roots": {"wsA": str(world["wsA"]), "wsB": str(world["wsB"])},
            "owners": {"wsA": ["alice"], "wsB": ["bob"]},
        },
        "sandbox": {"mode": "required", **sandbox},
        "acp_agents": {
            f"{AGENT}__command": [sys.executable, FAKE_ACP_AGENT, "--behaviour", "basic"],
            f"{AGENT}__network": [f"127.0.0.1:{upstream.port}"],
            f"{AGENT}__session_timeout": WAIT,
        },
    }
    return await make_gateway(overrides=overrides, tokens=TOKENS)


async def probe(
    client: TestClient, headers: dict[str, str], workspace: str, spec: dict[str, Any], session: str = "s-probe"
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    body = run_body(
        "probe " + json.dumps(spec),
        agentId=AGENT,
        sessionId=session,
        workspaceId=workspace,
        context={"allowedRoots": ["notes"]},
    )
    run, events = await run_to_end(client, body, headers)
    assert events[-1]["event"] == "run.completed", events[-1]
    done = [e for e in events if e["event"] == "message.completed"]
    assert done, events
    text = done[-1]["data"]["payload"]["text"]
    assert text.startswith("probe: "), text
    return run, json.loads(text.removeprefix("probe: ")), events


def refused(result: str) -> bool:
    return result.startswith("error:")


async def test_an_agent_reaches_only_what_its_run_may(
    make_gateway: MakeGateway, world: dict[str, Path], fake_llm: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET_VALUE)  # a provider key in the gateway's own environment
    client = await gateway(make_gateway, world, fake_llm)
    data_dir = gateway_of(client).data_dir
    assert (await client.get("/v1/health")).status == 200  # the gateway learns its own URL
    gateway_port = client.port
    ws_a, ws_b = world["wsA"], world["wsB"]
    spec = {
        "read": [
            str(ws_a / "notes" / "today.md"),  # inside the run's allowed root: readable
            str(world["secret"]),
            str(world["config"]),
            str(ws_b / "notes" / "today.md"),
            str(ws_a / "private.md"),  # the run's own workspace, outside its allowed roots
            f"/proc/{os.getpid()}/environ",
            "/etc/shadow",
        ],
        "listdir": [str(data_dir), str(ws_a)],
        "write": {
            str(ws_a / "notes" / "agent.md"): "written by the agent",
            str(ws_b / "notes" / "evil.md"): "x",
            str(ws_a / "evil.md"): "x",
            str(world["secret"].parent / "evil.md"): "x",
        },
        "connect": [["127.0.0.1", 5432], ["127.0.0.1", 6379], ["169.254.169.254", 80]],
        "http": [
            [fake_llm.base_url.rstrip("/") + "/models", {}],  # its model endpoint: allowed
            [f"http://127.0.0.1:{gateway_port}/v1/sessions", BOB],  # the gateway's API: never
            [f"http://127.0.0.1:{gateway_port}/v1/health", {}],
        ],
        "env": [SECRET_ENV],
        "whoami": True,
        "pids": True,
    }
    _, seen, events = await probe(client, ALICE, "wsA", spec)

    assert seen[f"read {ws_a / 'notes' / 'today.md'}"] == "ok:wsA notes"
    for path in (world["secret"], world["config"], ws_b / "notes" / "today.md", ws_a / "private.md", "/etc/shadow"):
        assert refused(seen[f"read {path}"]), (path, seen[f"read {path}"])
    assert SECRET_VALUE not in json.dumps(seen) and "tok-bob" not in json.dumps(seen)
    assert seen[f"env {SECRET_ENV}"] is None
    # The data directory shows nothing of the gateway's: only the way to the agent's own home.
    listed = seen[f"listdir {data_dir}"]
    assert refused(listed) or listed == "ok:['agent-homes']", listed
    assert len(os.listdir(data_dir)) > 1  # the journal, the spool...
    assert seen[f"listdir {ws_a}"] == "ok:['notes']"  # the workspace shows its allowed roots only

    assert seen[f"write {ws_a / 'notes' / 'agent.md'}"].startswith("ok:")
    assert (ws_a / "notes" / "agent.md").read_text(encoding="utf-8") == "written by the agent"
    for path in (ws_b / "notes" / "evil.md", ws_a / "evil.md", world["secret"].parent / "evil.md"):
        assert refused(seen[f"write {path}"]), path
        assert not path.exists(), path

    for target in ("127.0.0.1:5432", "127.0.0.1:6379", "169.254.169.254:80"):
        assert refused(seen[f"connect {target}"]), (target, seen[f"connect {target}"])
    metrics = await (await client.get("/metrics", headers=ALICE)).text()
    assert 'agent_gateway_sandbox_egress_total{outcome="allowed"} 1' in metrics, metrics
    assert seen["http " + fake_llm.base_url.rstrip("/") + "/models"].startswith("ok:200 ")
    for path in ("/v1/sessions", "/v1/health"):
        answer = seen[f"http http://127.0.0.1:{gateway_port}{path}"]
        # Inside, the gateway's port serves the MCP surface alone.
        assert answer.startswith("ok:404") or refused(answer), answer

    if os.geteuid() == 0:
        assert seen["uid"] != 0
    assert len(seen["pids"]) <= 6, seen["pids"]  # bubblewrap's init, the supervisor, the agent
    assert os.getpid() not in seen["pids"] or os.getpid() <= 6

    # The agent's native write reached the host's watcher like any other change.
    changed = [e for e in events if e["event"] == "files.changed"]
    paths = [c["path"] for e in changed for c in e["data"]["payload"].get("changes", [])]
    if changed:
        assert any(p.endswith("agent.md") for p in paths), changed


async def test_homes_are_per_actor(make_gateway: MakeGateway, world: dict[str, Path], fake_llm: FakeOpenAI) -> None:
    client = await gateway(make_gateway, world, fake_llm)
    _, alice, _ = await probe(client, ALICE, "wsA", {"whoami": True})
    home = alice["home"]
    _, wrote, _ = await probe(client, ALICE, "wsA", {"write": {f"{home}/memory.txt": "my bank PIN is 4711"}})
    assert wrote[f"write {home}/memory.txt"].startswith("ok:")

    _, bob, _ = await probe(client, BOB, "wsB", {"whoami": True, "read": [f"{home}/memory.txt"], "listdir": [home]})
    assert bob["home"] != home
    assert refused(bob[f"read {home}/memory.txt"])
    assert refused(bob[f"listdir {home}"])
    assert "4711" not in json.dumps(bob)
    # Alice's next session (a new process) finds her home as she left it.
    _, again, _ = await probe(client, ALICE, "wsA", {"read": [f"{home}/memory.txt"]}, session="s-later")
    assert again[f"read {home}/memory.txt"] == "ok:my bank PIN is 4711"


async def test_a_run_without_a_workspace_folder_gets_an_empty_private_one(
    make_gateway: MakeGateway, fake_llm: FakeOpenAI
) -> None:
    overrides = {"sandbox": {"mode": "required"}}
    client = await make_gateway(overrides=overrides, extra_plugins=(ProbeAgent(fake_llm.base_url),))
    data_dir = gateway_of(client).data_dir
    _, seen, _ = await probe(client, {}, "local:nowhere", {"whoami": True})
    cwd = seen["cwd"]
    _, listed, _ = await probe(client, {}, "local:nowhere", {"listdir": [cwd]})
    assert listed[f"listdir {cwd}"] == "ok:[]"
    assert Path(cwd) != data_dir and not (data_dir / "workspaces").exists()


class MarkingSandbox:
    """A third-party sandbox: wraps the agent in `env` with a marker, confining nothing."""

    def __init__(self) -> None:
        self.launches: list[AgentLaunch] = []

    @hookimpl
    def sandbox_agent(self, launch: AgentLaunch) -> SandboxedCommand:
        self.launches.append(launch)
        argv = ["/usr/bin/env", "AGW_WRAPPED=by-plugin", *launch.command]
        return SandboxedCommand(argv, dict(launch.env), str(launch.cwd), "marking: test plugin")


async def test_a_plugin_sandbox_replaces_bubblewrap(
    make_gateway: MakeGateway, world: dict[str, Path], fake_llm: FakeOpenAI
) -> None:
    marking = MarkingSandbox()
    overrides = {"workspaces": {"roots": {"wsA": str(world["wsA"])}}, "sandbox": {"mode": "required"}}
    client = await make_gateway(overrides=overrides, extra_plugins=(ProbeAgent(fake_llm.base_url), marking))
    _, seen, _ = await probe(client, {}, "wsA", {"env": ["AGW_WRAPPED"], "whoami": True})
    assert seen["env AGW_WRAPPED"] == "by-plugin"
    [launch] = marking.launches
    assert launch.actor_id == "local" or launch.actor_id
    assert launch.workspace_dir == world["wsA"]
    assert [dest for _, dest in launch.writable] == [world["wsA"] / "notes"]
    assert launch.home != gateway_of(client).data_dir and gateway_of(client).data_dir in launch.home.parents
    assert gateway_of(client).sandbox.confinements[AGENT] == "marking: test plugin"


async def test_required_refuses_an_agent_it_cannot_confine_and_auto_warns_once(
    make_gateway: MakeGateway,
    world: dict[str, Path],
    fake_llm: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(bubblewrap, "_probe_result", ["bubblewrap (bwrap) is not installed (test)"])
    client = await gateway(make_gateway, world, fake_llm)
    body = run_body("hello", agentId=AGENT, workspaceId="wsA", context={"allowedRoots": ["notes"]})
    _, events = await run_to_end(client, body, ALICE)
    assert events[-1]["event"] == "run.failed"
    failed = events[-1]["data"]["payload"]
    reason = json.dumps(failed)
    assert 'mode = \\"required\\"' in reason and "bwrap" in reason, failed

    auto = await gateway(make_gateway, world, fake_llm, mode="auto")
    for session in ("s-1", "s-2"):
        body = run_body("hello", agentId=AGENT, sessionId=session, workspaceId="wsA")
        _, events = await run_to_end(auto, body, ALICE)
        assert events[-1]["event"] == "run.completed", events[-1]
    warnings = [r for r in caplog.records if "AGENTS RUN UNCONFINED" in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_bubblewrap_hides_the_data_dir_inside_a_readable_install(tmp_path: Path) -> None:
    """The data directory and config file are covered even when an install the agent reads holds
    them (e.g. a gateway run from its checkout with the data inside)."""
    install = tmp_path / "install"
    (install / "data" / "agent-homes" / "a" / "alice").mkdir(parents=True)
    (install / "data" / "gateway.db").write_text("journal", encoding="utf-8")
    (install / "config.toml").write_text("tokens", encoding="utf-8")
    home = install / "data" / "agent-homes" / "a" / "alice"
    launch = AgentLaunch(
        agent_id="a",
        actor_id="alice",
        workspace_id="w",
        command=["/bin/sh", "-c", f"ls {install}/data; cat {install}/config.toml; ls {home}"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=home,
        home=home,
        workspace_dir=home / "no-workspace",
        read_only=[install],
        hide=[install / "data", install / "config.toml"],
    )
    argv, env, _ = bubblewrap.build_argv(launch, None)
    import subprocess

    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=WAIT, check=False)
    assert "gateway.db" not in done.stdout and "tokens" not in done.stdout, done.stdout
    assert "agent-homes" in done.stdout  # the home is mounted on top of the covered data folder
    assert shutil.which("bwrap")


def test_doctor_says_how_each_agent_is_confined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from agent_gateway.cli import cli

    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[gateway]
data_dir = "{tmp_path / "data"}"

[sandbox]
mode = "required"

[acp_agents.probe]
command = ["{sys.executable}", "{FAKE_ACP_AGENT}"]
network = ["127.0.0.1:8000"]
""",
        encoding="utf-8",
    )
    done = CliRunner().invoke(cli, ["doctor", "--config", str(config)])
    assert done.exit_code == 0, done.output
    assert "sandbox: mode 'required'" in done.output
    [line] = [line for line in done.output.splitlines() if line.startswith("probe: ")]
    assert line.startswith("probe: confined: bubblewrap"), line
    assert "reaches: 127.0.0.1:8000" in done.output

    monkeypatch.setattr(bubblewrap, "_probe_result", ["bubblewrap (bwrap) is not installed (test)"])
    done = CliRunner().invoke(cli, ["doctor", "--config", str(config)])
    assert done.exit_code == 1
    assert "probe: REFUSED:" in done.output and "bwrap" in done.output


async def test_the_egress_proxy_relays_only_what_the_allow_list_names(fake_llm: FakeOpenAI) -> None:
    import asyncio

    from agent_gateway.sandbox.egress import SandboxNetwork

    network = SandboxNetwork()
    proxy = await network.open_egress([("127.0.0.1", fake_llm.port)])
    try:

        async def connect(target: str) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_unix_connection(str(proxy.path))
            writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            async with asyncio.timeout(WAIT):
                head = await reader.readuntil(b"\r\n\r\n")
            return head, reader, writer

        for target in ("127.0.0.1:6379", "127.0.0.1:5432", "169.254.169.254:80", f"localhost:{fake_llm.port}"):
            head, _, writer = await connect(target)
            assert head.startswith(b"HTTP/1.1 403 "), (target, head)
            writer.close()
        head, reader, writer = await connect(f"127.0.0.1:{fake_llm.port}")
        assert head.startswith(b"HTTP/1.1 200 "), head
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(WAIT):
            answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        writer.close()
        assert network.counters == {"denied": 4, "allowed": 1}
    finally:
        await proxy.close()
        await network.close()


def test_a_symlink_an_agent_leaves_in_its_home_is_replaced_not_written_through(tmp_path: Path) -> None:
    """The gateway (root, where agents run as nobody) rewrites an agent's config in its home
    before every start: a symlink the agent planted there must not aim that write elsewhere."""
    from agent_gateway import write_home_file
    from agent_gateway.plugins.hermes import write_hermes_config

    home = tmp_path / "home"
    home.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("the gateway's own file", encoding="utf-8")
    (home / "config.yaml").symlink_to(precious)
    write_hermes_config(home, "http://127.0.0.1:9/v1", "m", "key", 1000)
    assert precious.read_text(encoding="utf-8") == "the gateway's own file"
    assert not (home / "config.yaml").is_symlink() and "127.0.0.1:9" in (home / "config.yaml").read_text()

    (home / "sub").symlink_to(tmp_path)
    with pytest.raises(Exception, match="symlink"):
        write_home_file(home / "sub" / "x.toml", "x")
    assert not (tmp_path / "x.toml").exists()
