"""Several gateways on one PostgreSQL database (and one Redis): real `agent-gateway serve`
processes, real PostgreSQL, real Redis. Every wait is bounded; nothing sleeps to synchronise."""

from __future__ import annotations

import threading
from pathlib import Path

import aiohttp

from tests._cluster import fresh_database, get_json, instances


async def test_three_gateways_started_at_once_on_an_empty_database_all_come_up(tmp_path: Path) -> None:
    # Concurrent schema creation used to kill about half the starts (UniqueViolation on pg_type).
    for attempt in range(2):
        with fresh_database() as url:
            async with instances(tmp_path / str(attempt), url, 3, redis_url=None) as gateways:
                async with aiohttp.ClientSession() as http:
                    for gw in gateways:
                        status, health = await get_json(http, f"{gw.url}/v1/health")
                        assert status == 200 and health["status"] == "ok", health


def test_storages_opened_at_the_same_instant_on_an_empty_database_all_open() -> None:
    # The same race without process start-up times to spread it out: every open() released by
    # one barrier, on a fresh database each round.
    from agent_gateway.plugins.journal_peewee import PeeweeStorage

    for _ in range(3):
        with fresh_database() as url:
            storages = [PeeweeStorage(url) for _ in range(6)]
            barrier = threading.Barrier(len(storages), timeout=30)
            errors: list[BaseException] = []

            def open_at_once(storage: PeeweeStorage, barrier: threading.Barrier, errors: list[BaseException]) -> None:
                barrier.wait()
                try:
                    storage.open()
                except BaseException as exc:  # collected: the assertion names it
                    errors.append(exc)

            threads = [threading.Thread(target=open_at_once, args=(s, barrier, errors)) for s in storages]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            for storage in storages:
                storage.close()
            assert not errors, errors
