"""Helpers for the file-watcher tests: write files and wait for the changes a stream reports."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from tests._harness import WAIT, sse_events


class Stream:
    """One SSE connection read in the background; `until(pred)` waits (bounded) for an event."""

    def __init__(self, client: TestClient, path: str, headers: dict[str, str] | None = None) -> None:
        self.client, self.path, self.headers = client, path, headers or {}
        self.events: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Stream:
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _read(self) -> None:
        async with self.client.get(self.path, headers=self.headers) as response:
            assert response.status == 200, await response.text()
            async for event in sse_events(response):
                self.events.append(event)
                self._new.set()

    async def until(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = WAIT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                self._new.clear()
                await self._new.wait()

    def changes(self) -> list[dict[str, Any]]:
        return [c for e in self.events if e["event"] == "files.changed" for c in e["data"]["payload"]["changes"]]


def changed(path: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["event"] == "files.changed" and any(c["path"] == path for c in e["data"]["payload"]["changes"])


async def write(path: Path, text: str) -> None:
    await asyncio.to_thread(path.write_text, text, "utf-8")
