"""Built-in cluster plugin: several gateway instances on one PostgreSQL database and one Redis.

Off unless ``[cluster] redis_url`` is set. Then it answers ``cluster_coordinator`` with a
:class:`RedisCoordinator`: leases and fencing live in PostgreSQL (in the same transaction as the
writes they guard), the live tail of every run and the calls between instances go through Redis
pub/sub. See ``docs/deployment.md``.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent_gateway import PluginError, hookimpl

SECTION = "cluster"
DEFAULTS: dict[str, Any] = {
    "redis_url": "",
    "instance_id": "",
    "key_prefix": "agent-gateway:",
    "lease_seconds": 10.0,
    "heartbeat_seconds": 2.0,
    "forward_timeout_seconds": 10.0,
    "secret": "",
    "previous_secrets": [],
    "message_max_age_seconds": 30.0,
    "tls_ca_file": "",
    "tls_cert_file": "",
    "tls_key_file": "",
}
REDIS_SCHEMES = ("redis", "rediss", "unix")
# HMAC-SHA256 keys: at least as long as the hash.
MIN_SECRET_BYTES = 32
SECRET_HINT = "e.g. openssl rand -hex 32"


def validate(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    url = section["redis_url"]
    if url and urlsplit(url).scheme not in REDIS_SCHEMES:
        problems.append(("redis_url", "must be a redis://, rediss:// or unix:// URL (or empty: no cluster)"))
    instance_id = section["instance_id"]
    if instance_id and (len(instance_id) > 64 or not instance_id.replace("-", "").replace("_", "").isalnum()):
        problems.append(("instance_id", "must be 1-64 letters, digits, '-' or '_' (or empty: generated)"))
    if url:
        secret = section["secret"]
        if not secret:
            problems.append(
                ("secret", f"required in cluster mode: every Redis message is signed with it ({SECRET_HINT})")
            )
        elif len(secret.encode()) < MIN_SECRET_BYTES:
            problems.append(("secret", f"must be at least {MIN_SECRET_BYTES} bytes ({SECRET_HINT})"))
    previous = section["previous_secrets"]
    if not isinstance(previous, list) or not all(isinstance(item, str) for item in previous):
        problems.append(("previous_secrets", "must be a list of strings"))
    elif any(len(item.encode()) < MIN_SECRET_BYTES for item in previous):
        problems.append(("previous_secrets", f"each must be at least {MIN_SECRET_BYTES} bytes"))
    tls_files = [key for key in ("tls_ca_file", "tls_cert_file", "tls_key_file") if section[key]]
    if tls_files and url and urlsplit(url).scheme != "rediss":
        problems.append((tls_files[0], "needs a rediss:// redis_url"))
    if bool(section["tls_cert_file"]) != bool(section["tls_key_file"]):
        problems.append(("tls_cert_file", "tls_cert_file and tls_key_file go together (a client certificate)"))
    for key in tls_files:
        if not Path(section[key]).expanduser().is_file():
            problems.append((key, f"no such file: {section[key]}"))
    for key in ("lease_seconds", "heartbeat_seconds", "forward_timeout_seconds", "message_max_age_seconds"):
        if section[key] <= 0:
            problems.append((key, "must be positive"))
    if 0 < section["heartbeat_seconds"] and section["lease_seconds"] < 2 * section["heartbeat_seconds"]:
        problems.append(
            ("lease_seconds", "must be at least twice heartbeat_seconds (a lease outlives one late renewal)")
        )
    return problems


@hookimpl
def config_sections(register: Any) -> None:
    register(SECTION, DEFAULTS, validate, doc="Several instances on PostgreSQL + Redis (docs/deployment.md)")


def cluster_problem(config: Any) -> str | None:
    """Why ``[cluster]`` cannot be served with this configuration, or None."""
    if not config.section(SECTION)["redis_url"]:
        return None
    scheme = urlsplit(config.storage_url).scheme
    if scheme not in ("postgres", "postgresql"):
        return (
            f"cluster mode ([cluster] redis_url) needs PostgreSQL storage shared by every instance; "
            f"[storage] url is {scheme}://"
        )
    try:
        import_module("redis.asyncio")
    except ImportError:
        return "cluster mode needs the redis package, which is not installed: pip install 'agent-gateway[cluster]'"
    return None


@hookimpl(trylast=True)
def cluster_coordinator(config: Any) -> Any:
    """A :class:`RedisCoordinator` when ``[cluster] redis_url`` is set, else None."""
    section = config.section(SECTION)
    if not section["redis_url"]:
        return None
    problem = cluster_problem(config)
    if problem:
        raise PluginError(problem)
    from .coordinator import RedisCoordinator

    return RedisCoordinator(section)
