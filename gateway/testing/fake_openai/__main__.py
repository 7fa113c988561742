"""Command line: ``python -m agent_gateway.testing.fake_openai --port 0 --script FILE``."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import click

from agent_gateway.testing.fake_openai.server import FakeOpenAI, Reply, load_script


async def _serve(fake: FakeOpenAI, port: int) -> None:
    base_url = await fake.start(port)
    print(f"fake-openai listening on {base_url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await fake.stop()


@click.command(name="agent-gateway-fake-openai")
@click.option("--port", type=int, default=0, show_default=True, help="0 picks a free port.")
@click.option(
    "--script",
    "script",
    type=click.Path(exists=True, dir_okay=False),
    help='JSON list of replies (strings or Reply objects), or {"replies": [...], "default": ...}.',
)
@click.option("--echo", is_flag=True, help="After the script, echo the last user message.")
@click.option("--default", "default_text", help="After the script, answer with this text.")
@click.option("--api-key", help="Require 'Authorization: Bearer KEY'.")
@click.option("--model", "models", multiple=True, help="Model id for /v1/models (repeatable).")
@click.option("--embedding-dim", type=int, default=16, show_default=True)
def main(
    port: int,
    script: str | None,
    echo: bool,
    default_text: str | None,
    api_key: str | None,
    models: tuple[str, ...],
    embedding_dim: int,
) -> None:
    """Serve a scriptable fake OpenAI-compatible API on 127.0.0.1."""
    replies: list[Reply] = []
    default: Reply | None = None
    if script:
        try:
            replies, default = load_script(script)
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--script") from exc
    if default_text is not None:
        default = Reply(text=default_text)
    elif echo:
        default = None
    elif script and default is None:
        default = Reply(status=500, error_message="fake-openai: script exhausted")
    fake = FakeOpenAI(
        replies,
        default=default,
        embedding_dim=embedding_dim,
        model_ids=models or ("m",),
        api_key=api_key,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(fake, port))


if __name__ == "__main__":
    main()
