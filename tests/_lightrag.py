"""Helpers for knowledge tests against the real LightRAG server (a peer): starting it on a
free port, the fake LLM and embeddings it uses, and waiting for documents to be indexed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from agent_gateway.app import GATEWAY_KEY
from agent_gateway.plugins.lightrag import service_of
from agent_gateway.plugins.lightrag.service import Where, wait_processed
from agent_gateway.testing.fake_openai import Reply
from tests._harness import require_mark

PEERS = Path(os.environ.get("AGENT_GATEWAY_PEERS_DIR") or Path.home() / ".cache" / "agent-gateway" / "peers")


SERVER_BIN = Path(os.environ.get("LIGHTRAG_SERVER_BIN") or PEERS / "bin" / "lightrag-server")


TIKTOKEN_DIR = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or PEERS / "tiktoken")


TIKTOKEN_FILE = "fb374d419588a4632f3f557e76b4b70aebbca790"


API_KEY = "rag-secret-key-1234"


WORKSPACE = "local:test"


EMBEDDING_DIM = 64


STARTUP_SECONDS = 90.0


WAIT = 60.0


WIDGET = "# Widget\n\nThe Acme Widget is a blue gadget made by Acme Corp.\nThe widget weighs two kilograms.\n"


ZEBRA = "# Zebra\n\nThe striped zebra lives on the savanna.\nZebra stripes are black and white.\n"


OTHER_WIDGET = "# Old widget\n\nAn older widget prototype was green and made of wood.\n"


STOP = {"the", "a", "an", "is", "are", "of", "and", "by", "on", "in", "what", "how", "to", "with", "made"}


def bag_of_words(text: str, dim: int) -> list[float]:
    """Similar text, similar vectors: hashed word counts, L2-normalised (float32-exact)."""
    vector = [0.0] * dim
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in STOP:
            continue
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % dim] += 1.0
    if not any(vector):
        vector[0] = 1.0
    norm = math.sqrt(sum(v * v for v in vector))
    packed = struct.pack(f"<{dim}f", *(v / norm for v in vector))
    return list(struct.unpack(f"<{dim}f", packed))


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


EXTRACTIONS = {
    "Acme Widget": (
        "entity<|#|>Acme Widget<|#|>product<|#|>The Acme Widget is a blue gadget made by Acme Corp.\n"
        "entity<|#|>Acme Corp<|#|>organization<|#|>Acme Corp makes the Acme Widget.\n"
        "relation<|#|>Acme Corp<|#|>Acme Widget<|#|>manufacturing<|#|>Acme Corp manufactures the Acme Widget.\n"
    ),
    "zebra": (
        "entity<|#|>Zebra<|#|>animal<|#|>The striped zebra lives on the savanna.\n"
        "entity<|#|>Savanna<|#|>location<|#|>The savanna is where zebras live.\n"
        "relation<|#|>Zebra<|#|>Savanna<|#|>habitat<|#|>Zebras live on the savanna.\n"
    ),
}


@dataclass
class LlmScript:
    """What the fake LLM answers LightRAG; ``hang_answers`` makes the answer call hang (after
    setting ``answer_arrived``), to stop the server mid-query."""

    hang_answers: bool = False
    answer_arrived: threading.Event = field(default_factory=threading.Event)
    # Names the answer's reference list adds to those LightRAG gave (a model citing what it was
    # not given, e.g. another workspace's file).
    extra_references: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> Reply | str:
        messages = body.get("messages") or []
        system = "\n".join(_text(m) for m in messages if m.get("role") == "system")
        user = _text(messages[-1]) if messages else ""
        everything = system + "\n" + "\n".join(_text(m) for m in messages)
        if "<|#|>" in system or "Knowledge Graph Specialist" in system:
            found = [lines for name, lines in EXTRACTIONS.items() if name.lower() in everything.lower()]
            return "".join(found) + "<|COMPLETE|>" if found else "I could not find anything."
        if "keyword" in everything.lower() and (body.get("response_format") or "keywords" in everything.lower()):
            words = [w for w in re.findall(r"[A-Za-z]+", user) if w.lower() not in STOP]
            return json.dumps({"high_level_keywords": words[:2], "low_level_keywords": words[:6]})
        if self.hang_answers:
            self.answer_arrived.set()
            return Reply(hang=True)
        # An answer that cites like a real model: it repeats the reference list LightRAG gave it
        # (with the provider's file names), which the gateway must map back to workspace paths.
        refs = re.findall(r"^\s*[-*]?\s*\[(\d+)\]\s*(\S+)\s*$", system, re.MULTILINE)
        refs += [(str(len(refs) + i + 1), name) for i, name in enumerate(self.extra_references)]
        listing = "\n".join(f"- [{n}] {name}" for n, name in refs)
        return f"The Acme Widget is blue and the zebra is striped.\n\n### References\n{listing}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LightRAG:
    process: subprocess.Popen[bytes]
    url: str
    working_dir: Path
    log: list[str]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def start_lightrag(base: Path, llm_url: str) -> LightRAG:
    require_mark("peers", "the real LightRAG server")
    if not SERVER_BIN.exists():
        pytest.fail(
            f"lightrag-server not found at {SERVER_BIN}: run `contrib/peers/install.sh lightrag` "
            "(or set LIGHTRAG_SERVER_BIN)",
            pytrace=False,
        )
    if not (TIKTOKEN_DIR / TIKTOKEN_FILE).exists():
        pytest.fail(
            f"tiktoken's o200k_base file is missing from {TIKTOKEN_DIR}: run `contrib/peers/install.sh lightrag` "
            "(or set TIKTOKEN_CACHE_DIR)",
            pytrace=False,
        )
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    working = base / "rag-storage"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(base),
        "LLM_BINDING": "openai",
        "LLM_BINDING_HOST": llm_url,
        "LLM_MODEL": "m",
        "LLM_BINDING_API_KEY": "x",
        "EMBEDDING_BINDING": "openai",
        "EMBEDDING_BINDING_HOST": llm_url,
        "EMBEDDING_MODEL": "e",
        "EMBEDDING_DIM": str(EMBEDDING_DIM),
        "EMBEDDING_BINDING_API_KEY": "x",
        "LIGHTRAG_API_KEY": API_KEY,
        "WHITELIST_PATHS": "/health",
        "TIKTOKEN_CACHE_DIR": str(TIKTOKEN_DIR),
        "WORKING_DIR": str(working),
        "INPUT_DIR": str(base / "inputs"),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "COSINE_THRESHOLD": "0.1",
        "TIMEOUT": "30",
        "LLM_TIMEOUT": "30",
    }
    process = subprocess.Popen(
        [str(SERVER_BIN)], cwd=str(base), env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    ready = threading.Event()
    lines: list[str] = []

    def drain() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            lines.append(line)
            if "Application startup complete" in line or "Uvicorn running on" in line:
                ready.set()
        ready.set()  # exited

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(STARTUP_SECONDS) or process.poll() is not None:
        process.kill()
        tail = "\n".join(lines[-30:])
        pytest.fail(f"lightrag-server did not start within {STARTUP_SECONDS:g} s:\n{tail}", pytrace=False)
    return LightRAG(process, f"http://127.0.0.1:{port}", working, lines)


class Seen:
    """Every response text, checked for provider leaks at the end of a test."""

    def __init__(self, server: LightRAG) -> None:
        self.server = server
        self.texts: list[str] = []

    def add(self, value: Any) -> Any:
        self.texts.append(value if isinstance(value, str) else json.dumps(value))
        return value

    def check(self) -> None:
        port = self.server.url.rsplit(":", 1)[1]
        for text in self.texts:
            assert self.server.url not in text, text[:500]
            assert f"127.0.0.1:{port}" not in text and f"localhost:{port}" not in text, text[:500]
            assert "file://" not in text, text[:500]
            assert str(self.server.working_dir) not in text and "rag-storage" not in text, text[:500]
            assert API_KEY not in text


async def index(client: TestClient, seen: Seen, paths: list[str]) -> None:
    gateway = client.app[GATEWAY_KEY]
    service = service_of(gateway)
    assert service is not None
    existing = {d["sourcePath"] for d in await service.list_documents(where(client))}
    for path in paths:
        if path in existing:
            continue
        response = await client.post("/v1/knowledge/documents", json={"workspaceId": WORKSPACE, "path": path})
        body = seen.add(await response.json())
        assert response.status == 202, body
        assert body["sourcePath"] == path and body["trackId"]
        tracked = await wait_processed(service, where(client), body["trackId"], timeout=WAIT)
        assert [d["status"] for d in tracked["documents"]] == ["processed"], tracked
        status = await client.get(f"/v1/knowledge/documents/track/{body['trackId']}", params={"workspaceId": WORKSPACE})
        seen.add(await status.text())
        assert (await status.json())["documents"][0]["sourcePath"] == path


def where(client: TestClient) -> Where:
    gateway = client.app[GATEWAY_KEY]

    async def in_thread(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(gateway.executor, fn, *args)

    return Where(WORKSPACE, gateway.config.workspace_roots[WORKSPACE], [""], in_thread)
