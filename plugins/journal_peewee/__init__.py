"""Built-in storage plugin: the peewee journal (SQLite by default, PostgreSQL by URL).

It answers ``storage_backend`` for ``sqlite://``, ``postgres://`` and ``postgresql://`` URLs and is
``trylast``, so a third-party storage plugin registered for the same scheme wins.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from agent_gateway import PluginError, hookimpl

from .store import POSTGRES_SCHEMES, SUPPORTED_SCHEMES, PeeweeStorage, handles_url, url_scheme

__all__ = ["SUPPORTED_SCHEMES", "PeeweeStorage", "storage_backend"]


@hookimpl(trylast=True)
def storage_backend(url: str, config: Any) -> PeeweeStorage | None:
    """A :class:`PeeweeStorage` for a SQLite or PostgreSQL URL; None for any other scheme."""
    if not handles_url(url):
        return None
    if url_scheme(url) in POSTGRES_SCHEMES:
        try:
            import_module("psycopg2")  # peewee's PostgreSQL driver, an optional extra
        except ImportError as exc:
            raise PluginError(
                "a postgresql:// storage URL needs the PostgreSQL driver (psycopg2), which is not installed: "
                "pip install 'agent-gateway[postgresql]'"
            ) from exc
    return PeeweeStorage(url)
