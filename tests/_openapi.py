"""The Schemathesis tests' gateway: a real gateway on a thread of its own with tokens per
scenario, and the fixtures `gateway_url` and `api_schema` (its served /openapi.json)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from aiohttp import web
from schemathesis.specs.openapi.schemas import OpenApiSchema

from agent_gateway.app import GATEWAY_KEY, create_app
from agent_gateway.config import Config
from agent_gateway.plugin_host import PluginHost
from agent_gateway.testing import LoopThread
from agent_gateway.testing.fake_openai import FakeOpenAI
from tests._fake_lightrag import FakeLightRAG
from tests._harness import WAIT

RUNS_TOKEN = "tok-conformance-runs"


WEBHOOK_SECRET = "whsec_" + "A" * 32


PREFS_TOKEN = "tok-conformance-prefs"


# Each stateful scenario runs as actors of its own: a scenario replayed by Hypothesis then meets the
# same (empty) state, not the runs and idempotency keys an earlier scenario left behind.
SCENARIO_ACTORS = 200


SCENARIO_TOKENS = [(f"tok-conformance-{n:04d}-runs", f"tok-conformance-{n:04d}-prefs") for n in range(SCENARIO_ACTORS)]


# The knowledge gateway's workspace ("default"): files a document can be added from.
WORKSPACE_FILES = {
    "notes/widget.md": "# Widget\n\nThe Acme Widget is blue.\nIt weighs two kilograms.\n",
    "notes/zebra.md": "# Zebra\n\nThe zebra is striped.\n",
}


class GatewayThread:
    """A fake upstream and a gateway on 127.0.0.1, served by an event loop in a thread.

    ``knowledge``: the lightrag plugin also points at a :class:`FakeLightRAG` (on the same loop),
    and the workspace ``default`` is a directory holding ``WORKSPACE_FILES``."""

    def __init__(self, data_dir: str, *, knowledge: bool = False) -> None:
        self.data_dir = data_dir
        self.thread: LoopThread | None = None
        self.fake = FakeOpenAI()
        self.lightrag = FakeLightRAG() if knowledge else None
        self.runner: web.AppRunner | None = None
        self.url = ""

    def _call(self, coroutine: Any) -> Any:
        assert self.thread is not None
        return self.thread.call(coroutine, WAIT)

    async def _start(self) -> None:
        await self.fake.start()
        knowledge: dict[str, Any] = {}
        if self.lightrag is not None:
            workspace = Path(self.data_dir) / "workspace"
            for name, text in WORKSPACE_FILES.items():
                (workspace / name).parent.mkdir(parents=True, exist_ok=True)
                (workspace / name).write_text(text, encoding="utf-8")
            knowledge = {
                "lightrag": {"url": await self.lightrag.start(), "api_key": self.lightrag.api_key},
                "workspaces": {"roots": {"default": str(workspace)}},
            }
        config = Config.load(
            None,
            env={},
            overrides={
                "gateway": {"data_dir": self.data_dir},
                "auth": {
                    "tokens": {
                        RUNS_TOKEN: "runs",
                        PREFS_TOKEN: "prefs",
                        **{token: f"scenario-{n}-runs" for n, (token, _) in enumerate(SCENARIO_TOKENS)},
                        **{token: f"scenario-{n}-prefs" for n, (_, token) in enumerate(SCENARIO_TOKENS)},
                    }
                },
                "chat_only": {"base_url": self.fake.base_url, "model": "m"},
                "hermes": {"enabled": False},
                "reasonix": {"enabled": False},
                "pi_lab": {"enabled": False},
                # A run body's `webhook` is accepted (it is schema-valid)...
                "webhooks": {"secret": WEBHOOK_SECRET},
                **knowledge,
            },
        )
        app = create_app(config, PluginHost.load(env={}))
        # ... but never sent: the fuzzed URLs name hosts the test must not resolve or reach
        # (deliveries are tested in test_webhooks.py).
        app[GATEWAY_KEY].webhooks.enabled_for_delivery = False
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.lightrag is not None:
            await self.lightrag.stop()
        await self.fake.stop()

    def __enter__(self) -> GatewayThread:
        self.thread = LoopThread("gateway")
        self._call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call(self._stop())
        finally:
            assert self.thread is not None
            self.thread.stop(WAIT)


def headers_for(case: schemathesis.Case, tokens: tuple[str, str] = (RUNS_TOKEN, PREFS_TOKEN)) -> dict[str, str]:
    runs_token, prefs_token = tokens
    token = prefs_token if case.operation.path == "/v1/preferences" else runs_token
    return {"Authorization": f"Bearer {token}"}


EXAMPLES = 15  # per operation and phase: the whole file stays well under a minute on 2 cores


SEED = 20261201


# The lightrag plugin's routes: checked on a gateway of their own (tests/test_knowledge_openapi.py).
KNOWLEDGE = r"^/v1/knowledge/"


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """Schemathesis 4.32.5's lazy schemas read and rewrite ``node._nodeid`` (to name each
    operation's subtest), an attribute pytest 9 no longer has: give it one."""
    request.node._nodeid = request.node.nodeid


@pytest.fixture(scope="module", name="gateway_url")
def gateway_url_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with GatewayThread(str(tmp_path_factory.mktemp("conformance"))) as gateway:
        yield gateway.url


def load_schema(gateway_url: str) -> OpenApiSchema:
    """The served /openapi.json, with this suite's Schemathesis settings (fixed seed, derandomized,
    no example database, EXAMPLES per operation and phase)."""
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "request-timeout": WAIT,
            "max-stream-events": 200,
            # Every built-in check, on by default; named so a default turned off shows here.
            "checks": {"enabled": True},
            "generation": {
                "max-examples": EXAMPLES,
                "deterministic": True,
                "database": "none",
                # The gateway refuses NUL in any JSON text (400 invalid_text), which a JSON schema
                # cannot say for free-form objects; the document's description states it.
                "allow-x00": False,
            },
        }
    )
    return schemathesis.openapi.from_url(f"{gateway_url}/openapi.json", config=config)


@pytest.fixture(scope="module", name="api_schema")
def api_schema_fixture(gateway_url: str) -> OpenApiSchema:
    return load_schema(gateway_url).exclude(path_regex=KNOWLEDGE)
