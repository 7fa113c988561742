"""The `agent-gateway` launcher."""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import os
import signal
import ssl
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import click
from aiohttp import web

from agent_gateway.app import GATEWAY_KEY, StartupError, create_app, is_loopback
from agent_gateway.config import Config, ConfigError, check_problems, redact_url, section_specs_from_hook
from agent_gateway.logs import configure as configure_logging
from agent_gateway.mcp.bridge import add_commands as add_mcp_commands
from agent_gateway.plugin_host import PluginError, PluginHost
from agent_gateway.server.http_server import ConnectionLimits, GatewayRunner, GuardedTCPSite

DEFAULT_URL_ENV = "AGENT_GATEWAY_URL"
TOKEN_ENV = "AGENT_GATEWAY_TOKEN"
DEMO_MESSAGE = "Hello! What can an agent gateway do?"
DEMO_REPLY = (
    "An agent gateway sits between your app and agent runtimes. Every run gets an ordered, "
    "persisted event journal, so a stream survives refreshes, dropped connections and restarts."
)


def _load(config_path: str | None, overrides: dict[str, dict[str, Any]] | None = None) -> tuple[Config, PluginHost]:
    try:
        plugins = PluginHost.load()
        config = Config.load(config_path, section_specs_from_hook(plugins.config_sections()), overrides=overrides)
    except (ConfigError, PluginError) as exc:
        raise click.ClickException(str(exc)) from exc
    return config, plugins


@click.group()
@click.version_option(package_name="agent-gateway")
def cli() -> None:
    """Agent Gateway: one HTTP API in front of many agent runtimes."""


# -- serve ---------------------------------------------------------------------------------------
@cli.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--host", help="Listen address (default from config: 127.0.0.1).")
@click.option("--port", type=int, help="Listen port; 0 picks a free one.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Where the SQLite journal and spool live.")
@click.option("--demo", is_flag=True, help="Wire a built-in fake OpenAI upstream and stream a demo run.")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "text"]),
    default="auto",
    show_default=True,
    help="auto: JSON lines unless stderr is a terminal.",
)
def serve(
    config_path: str | None, host: str | None, port: int | None, data_dir: str | None, demo: bool, log_format: str
) -> None:
    """Run the gateway."""
    configure_logging(log_format)
    overrides: dict[str, dict[str, Any]] = {"gateway": {}}
    if host is not None:
        overrides["gateway"]["host"] = host
    if port is not None:
        overrides["gateway"]["port"] = port
    if data_dir is not None:
        overrides["gateway"]["data_dir"] = data_dir
    config, plugins = _load(config_path, overrides)
    problems = config.problems()
    if problems:
        raise click.ClickException("invalid configuration:\n" + "\n".join(problems))
    listen_host = config.section("gateway")["host"]
    try:
        authenticated = plugins.authentication_required(config)
    except PluginError as exc:
        raise click.ClickException(str(exc)) from exc
    if not authenticated and not is_loopback(listen_host):
        raise click.ClickException(
            f"refusing to listen on {listen_host}: no [auth] tokens (nor an authentication plugin such as "
            "[auth_jwt]) are configured, so every caller would be the local actor. Configure tokens or "
            "listen on 127.0.0.1."
        )
    asyncio.run(_serve(config, plugins, demo))


# Young-generation collections every 20,000 allocations instead of 700: a busy run allocates a few
# objects per event, nearly all freed within milliseconds, and the default threshold made the
# collector walk them (and promote survivors) about once per 200 events.
GC_THRESHOLDS = (20_000, 20, 100)


def tune_gc_for_serving() -> None:
    """Freeze what start-up allocated (plugins, config, routes: never garbage) out of the
    collector's view, and collect the young generation less often."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def set_gil_switch_interval(milliseconds: float) -> None:
    """`[gateway] gil_switch_interval_ms`: how long a thread waiting for the GIL waits before it
    asks the running one to hand it over (0: Python's 5 ms). Shorter, the storage threads get it
    back sooner from a busy loop (a new run's row, a group commit), at some cost in throughput."""
    if milliseconds > 0:
        sys.setswitchinterval(milliseconds / 1000)


async def _serve(config: Config, plugins: PluginHost, demo: bool) -> None:
    fake = None
    if demo:
        from agent_gateway.testing.fake_openai import FakeOpenAI, Reply

        fake = FakeOpenAI(default=Reply(DEMO_REPLY, chunk_size=6, delay=0.03))
        base_url = await fake.start()
        config.env_overrides.setdefault("chat_only", {}).update({"base_url": base_url, "model": "m"})
    gw = config.section("gateway")
    runner: web.AppRunner | None = None
    try:
        try:
            app = create_app(config, plugins)
            limits = ConnectionLimits.from_config(gw)
            starting = GatewayRunner(app, limits=limits, handle_signals=False)
            await starting.setup()  # opens storage: a failure here has nothing to clean up
            runner = starting
            tune_gc_for_serving()
            set_gil_switch_interval(float(gw["gil_switch_interval_ms"]))
            tls = _tls_context(gw["tls_cert"], gw["tls_key"])
            site = GuardedTCPSite(
                runner, gw["host"], gw["port"], ssl_context=tls, ssl_handshake_timeout=limits.header_timeout
            )
            await site.start()
        except (PluginError, StartupError) as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:  # binding the listening socket
            reason = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise click.ClickException(
                f"cannot listen on {gw['host']}:{gw['port']}: {reason} (choose another --port)"
            ) from exc
        addresses = runner.addresses  # the bound sockets: the port `--port 0` got
        port = int(addresses[0][1]) if addresses else gw["port"]
        shown_host = f"[{gw['host']}]" if ":" in gw["host"] else gw["host"]  # IPv6 literals need brackets
        url = f"{'https' if tls else 'http'}://{shown_host}:{port}"
        # What agents' MCP clients call back: the configured public URL, else where we listen
        # (never a request's Host header).
        app[GATEWAY_KEY].set_public_url(gw["public_url"] or url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # before the URL is printed: a caller may stop us then
            loop.add_signal_handler(sig, stop.set)
        click.echo(f"agent-gateway listening on {url}", err=False)
        click.echo(f"data directory: {config.data_dir}  storage: {redact_url(config.storage_url)}")
        sys.stdout.flush()
        if demo:
            try:
                await _demo(url)
            except (aiohttp.ClientError, OSError, KeyError, ValueError) as exc:  # keep serving
                click.echo(f"demo run failed: {type(exc).__name__}: {exc}", err=True)
        await stop.wait()
        # While still listening (new requests get 503): end streams, finish or interrupt runs.
        # Then aiohttp's cleanup finds no handler left to wait for, and closes agents and storage.
        await app[GATEWAY_KEY].drain()
    finally:
        if runner is not None:
            await runner.cleanup()
        if fake is not None:
            await fake.stop()


def _tls_context(cert: str, key: str) -> ssl.SSLContext | None:
    """The server's TLS context when ``[gateway] tls_cert``/``tls_key`` are set; a one-line
    error for files that do not load (wrong password-less PEM, key not matching the cert)."""
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(Path(cert).expanduser()), str(Path(key).expanduser()))
    except (OSError, ssl.SSLError) as exc:
        raise click.ClickException(f"[gateway] tls_cert/tls_key: cannot load {cert} and {key}: {exc}") from exc
    return context


async def _demo(url: str) -> None:
    click.echo("\n-- demo: a chat-only run, streamed from the gateway --")
    # The demo talks to this very process on its own listening address: with a self-signed
    # [gateway] tls_cert there is nothing to verify against, and nothing to gain from it.
    connector = aiohttp.TCPConnector(ssl=False) if url.startswith("https://") else None
    async with aiohttp.ClientSession(connector=connector) as http:
        body = {
            "requestId": f"demo-{os.getpid()}",
            "agentId": "chat-only",
            "sessionId": "demo",
            "message": DEMO_MESSAGE,
        }
        async with http.post(f"{url}/v1/runs", json=body) as response:
            receipt = await response.json()
        click.echo(f"you> {DEMO_MESSAGE}")
        await _tail(http, url, receipt["hostRunId"], {}, 0)
    click.echo(
        f"\nTry it yourself (another terminal):\n"
        f"  agent-gateway runs send --url {url} --agent chat-only 'Tell me more'\n"
        f"  curl -N {url}/v1/runs/{receipt['hostRunId']}/stream\n"
        "Press Ctrl-C to stop."
    )


# -- runs ----------------------------------------------------------------------------------------
add_mcp_commands(cli)


@cli.group()
def runs() -> None:
    """Create and follow runs on a running gateway."""


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


url_option = click.option("--url", envvar=DEFAULT_URL_ENV, default="http://127.0.0.1:8787", show_default=True)
token_option = click.option("--token", envvar=TOKEN_ENV, default=None, help="Bearer token.")


@runs.command("tail")
@click.argument("run_id")
@url_option
@token_option
@click.option("--after", default="0", help="Start after this seq.")
@click.option("--raw", is_flag=True, help="Print every event as JSON lines.")
def tail(run_id: str, url: str, token: str | None, after: str, raw: bool) -> None:
    """Follow a run's stream, resuming after a dropped connection; exit 1 unless it completed."""

    async def main() -> str:
        async with aiohttp.ClientSession() as http:
            return await _tail(http, url, run_id, _headers(token), int(after), raw=raw)

    status = asyncio.run(main())
    sys.exit(0 if status == "completed" else 1)


@runs.command("send")
@click.argument("message")
@click.option("--agent", "agent_id", default="chat-only", show_default=True)
@click.option("--session", "session_id", default="cli", show_default=True)
@click.option("--workspace", "workspace_id", default="default", show_default=True)
@url_option
@token_option
def send(message: str, agent_id: str, session_id: str, workspace_id: str, url: str, token: str | None) -> None:
    """Start a run and follow it."""

    async def main() -> str:
        async with aiohttp.ClientSession() as http:
            body = {
                "requestId": os.urandom(8).hex(),
                "agentId": agent_id,
                "sessionId": session_id,
                "workspaceId": workspace_id,
                "message": message,
            }
            async with http.post(f"{url}/v1/runs", json=body, headers=_headers(token)) as response:
                receipt = await response.json()
                if response.status >= 400:
                    raise click.ClickException(receipt.get("error", {}).get("message", str(receipt)))
            click.echo(f"run {receipt['hostRunId']}", err=True)
            return await _tail(http, url, receipt["hostRunId"], _headers(token), 0)

    status = asyncio.run(main())
    sys.exit(0 if status == "completed" else 1)


async def _tail(
    http: aiohttp.ClientSession,
    url: str,
    run_id: str,
    headers: dict[str, str],
    after: int,
    *,
    raw: bool = False,
    attempts: int = 30,
    echo: Callable[[str], Any] | None = None,
) -> str:
    """Print a run's stream; reconnect with Last-Event-ID up to `attempts` times."""
    out = echo or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    last = after
    for attempt in range(attempts):
        try:
            request_headers = {**headers, "Last-Event-ID": str(last)}
            async with http.get(
                f"{url}/v1/runs/{run_id}/stream",
                headers=request_headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
            ) as response:
                if response.status >= 400:
                    body = await response.text()
                    raise click.ClickException(f"{response.status}: {body}")
                async for event in _sse_events(response):
                    last = int(event["seq"])
                    status = _print_event(event, out, raw)
                    if status:
                        return status
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            pass  # a cut mid-stream surfaces as an incomplete chunked payload: resume too
        out(f"\n[connection lost; resuming after {last}]\n")
        await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))  # reconnect pacing, not synchronisation
    raise click.ClickException(f"gave up after {attempts} reconnects")


async def _sse_events(response: aiohttp.ClientResponse) -> Any:
    data: list[str] = []
    async for raw_line in response.content:
        line = raw_line.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield json.loads("\n".join(data))
                data = []
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip())


def _print_event(event: dict[str, Any], out: Callable[[str], Any], raw: bool) -> str | None:
    kind = event["kind"]
    if raw:
        out(json.dumps(event, ensure_ascii=False) + "\n")
    elif kind == "message.delta":
        out(event["payload"].get("text", ""))
    elif kind == "message.completed":
        out("\n")  # the message's text came as deltas; end its line
    elif kind in ("run.completed", "run.failed", "run.cancelled", "run.interrupted"):
        reason = event["payload"].get("reason")
        out(f"\n[{kind}{': ' + reason if reason else ''}]\n")
    elif kind in ("context.warning",):
        out(f"\n[warning: {event['payload'].get('message')}]\n")
    if kind in ("run.completed", "run.failed", "run.cancelled", "run.interrupted"):
        return str(kind).split(".", 1)[1]
    return None


# -- plugins and config ------------------------------------------------------------------------------
@cli.group("cluster")
def cluster_group() -> None:
    """Several instances on one database ([cluster])."""


@cluster_group.command("status")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def cluster_status(config_path: str | None, as_json: bool) -> None:
    """List the instances of the cluster, their leases, sessions and unfinished runs (read from
    the shared database; works with every instance stopped too)."""
    config, plugins = _load(config_path)
    try:
        coordinator = plugins.cluster_coordinator(config)
        if coordinator is None:
            raise click.ClickException("not a cluster: [cluster] redis_url is not set")
        storage = plugins.storage_backend(config.storage_url, config)
        if storage is None:
            raise click.ClickException(f"no storage plugin handles {redact_url(config.storage_url)!r}")
        storage = coordinator.wrap_storage(storage)
        storage.open()
        try:
            status = coordinator.status()
        finally:
            storage.close()
    except (PluginError, OSError) as exc:
        raise click.ClickException(" ".join(str(exc).split())) from exc
    except click.ClickException:
        raise
    except Exception as exc:  # e.g. the database is unreachable: one line, not a traceback
        raise click.ClickException(f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    for instance in status.get("instances", []):
        state = "alive" if instance["alive"] else "EXPIRED"
        click.echo(
            f"{instance['instanceId']:24} {state:8} lease {instance['leaseRemainingSeconds']:6.1f} s  "
            f"sessions {instance['sessions']:4}  runs {len(instance['runs']):4}  {instance.get('url') or ''}"
        )
        for run in instance["runs"]:
            click.echo(f"{'':26}{run['hostRunId']}  {run['status']}  session {run['sessionId']}")
    if not status.get("instances"):
        click.echo("no instances")


@cli.command("plugins")
@click.option("--json", "as_json", is_flag=True)
def plugins_command(as_json: bool) -> None:
    """List loaded plugins, their distributions and the hooks they implement."""
    try:
        host = PluginHost.load()
    except PluginError as exc:
        raise click.ClickException(str(exc)) from exc
    infos = host.plugins()
    if as_json:
        click.echo(json.dumps([info.__dict__ for info in infos], indent=2))
        return
    for info in infos:
        dist = f"{info.distribution} {info.version}" if info.distribution else "(registered in process)"
        click.echo(f"{info.name:16} {dist}\n{'':16} hooks: {', '.join(info.hooks)}")


@cli.group("config")
def config_group() -> None:
    """Inspect configuration."""


@config_group.command("check")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
def config_check(config_path: str | None) -> None:
    """Report every problem as `file: key: what is wrong`; exit 1 if there is any."""
    config, plugins = _load(config_path)
    problems = check_problems(config, plugins)
    for problem in problems:
        click.echo(problem)
    if problems:
        sys.exit(1)
    click.echo(f"{config.where}: ok")


@cli.command("doctor")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
def doctor(config_path: str | None) -> None:
    """Say, per agent, whether and how its processes are confined ([sandbox]), what they may
    reach and read; exit 1 when an agent could not start (`mode = "required"` and no sandbox)."""
    import asyncio
    import os

    from agent_gateway.sandbox import Sandbox, SandboxError

    config, plugins = _load(config_path)
    section = config.section("sandbox")
    sandbox = Sandbox(
        section,
        plugins,
        data_dir=config.data_dir,
        config_path=Path(config.path).resolve() if config.path else None,
    )
    who = f"agents run as uid {sandbox.run_as[0]}" if os.geteuid() == 0 else "agents run as the gateway's user"
    click.echo(f"sandbox: mode {section['mode']!r}; {who} where confined")
    failed = False
    for runtime in plugins.runtimes(config):
        preview = getattr(runtime, "sandbox_preview", None)
        if preview is None:
            click.echo(f"{runtime.agent_id}: starts no process the gateway confines (or says nothing of it)")
            continue
        launch = preview(config.data_dir)
        try:
            command = asyncio.run(sandbox.confine(launch))
        except SandboxError as exc:
            failed = True
            click.echo(f"{runtime.agent_id}: REFUSED: {exc}")
            continue
        reach = ", ".join(f"{host}:{port}" for host, port in launch.network) or "nothing but the MCP surface"
        click.echo(f"{runtime.agent_id}: {'confined' if command.confined else 'NOT CONFINED'}: {command.confinement}")
        click.echo(f"    home: {launch.home}")
        click.echo(f"    reaches: {reach}")
        click.echo(f"    reads: {', '.join(str(p) for p in launch.read_only) or 'the system only'}")
    if failed:
        sys.exit(1)


@config_group.command("show")
@click.option("--config", "config_path", type=click.Path(dir_okay=False))
def config_show(config_path: str | None) -> None:
    """Print the merged configuration (secrets masked)."""
    config, _ = _load(config_path)
    merged = {name: config.section(name) for name in sorted(config.specs)}
    if merged.get("auth", {}).get("tokens"):
        merged["auth"]["tokens"] = {f"***{i}": actor for i, actor in enumerate(merged["auth"]["tokens"].values())}
    click.echo(json.dumps(_masked(merged), indent=2, ensure_ascii=False))


SECRET_WORDS = ("key", "secret", "password", "token")


def _masked(value: Any, key: str = "") -> Any:
    """Secrets out of a config tree: values of secret-named keys, every value of an agent's
    ``env`` table (provider keys live there), credentials inside URLs; at any depth (the
    ``[acp_agents.<id>]`` tables nest one level more than other sections)."""
    if isinstance(value, dict):
        if key == "env":
            return {name: "***" if item else "" for name, item in value.items()}
        return {name: _masked(item, name) for name, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, key) for item in value]
    if any(word in key.lower() for word in SECRET_WORDS) and not isinstance(value, bool | int | float):
        return "***" if value else value
    if isinstance(value, str) and "://" in value and "@" in value:
        return redact_url(value)
    return value


def main() -> None:
    try:
        host = PluginHost.load()
        host.register_commands(cli)
    except PluginError as exc:  # one line, no traceback: the message names the plugin
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    cli()


if __name__ == "__main__":
    main()
