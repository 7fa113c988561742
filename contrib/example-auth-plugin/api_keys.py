"""The application's own API keys, from its SQLite table, as gateway actors (docs/auth.md).

CREATE TABLE api_keys (key_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL,
                       roles TEXT NOT NULL DEFAULT '', revoked INTEGER NOT NULL DEFAULT 0);
"""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from typing import Any

from agent_gateway import Actor, bearer_token, hookimpl

SECTION = "api_keys"


@hookimpl
def config_sections(register: Any) -> None:
    register(SECTION, {"database": ""}, doc="The application's SQLite database holding api_keys.")


@hookimpl
def authentication_enabled(config: Any) -> bool:
    return bool(config.section(SECTION)["database"])


@hookimpl
def authenticate(request: Any, config: Any) -> Actor | None:
    key, database = bearer_token(request), config.section(SECTION)["database"]
    if key is None or not key.startswith("ak_") or not database:
        return None  # not one of ours: JWTs and [auth] tokens are tried next
    digest = hashlib.sha256(key.encode()).hexdigest()  # the table keeps hashes, never keys
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        query = "SELECT user_id, roles FROM api_keys WHERE key_hash = ? AND NOT revoked"
        row = db.execute(query, (digest,)).fetchone()
    return Actor(row[0], {"roles": row[1].split()}) if row else None
