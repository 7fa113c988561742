"""Webhooks (docs/webhooks.md): when a run with a webhook ends, its receipt (``gateway.run.v1``,
what ``GET /v1/runs/{id}`` answers) is POSTed to the URL, signed per the Standard Webhooks
specification, retried with exponential backoff and jitter for ``retry_for_seconds``.

Durability: the delivery is a row of the journal's outbox table, written in the run row's own
transaction (``insert_run``). A row is due once the run's stored status is terminal, which the
gateway stores after the terminal event or repairs at start-up; any instance on the database may
claim a due row (a lease in the row), so deliveries survive restarts and move between instances.
At least once: a crash after the receiver answered but before the outcome is stored posts again,
with the same ``webhook-id`` for the receiver to deduplicate on.

Signing uses the specification's own library, ``standardwebhooks`` (one module, no dependencies):
``webhook-signature`` = ``v1,<base64 HMAC-SHA256 of {id}.{timestamp}.{body}>`` per secret.

SSRF: the URL's host is resolved once; every address must be public unless ``allowed_hosts``
lists the name, the address or a network holding it; the connection then goes to exactly those
addresses (a pinned resolver), with the name kept for the Host header and TLS SNI, so DNS cannot
answer differently between the check and the connect. Redirects are not followed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import ipaddress
import json
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from standardwebhooks import Webhook

from agent_gateway.models import Run, now_ms
from agent_gateway.storage import Storage

log = logging.getLogger("agent_gateway.webhooks")

SECRET_PREFIX = "whsec_"
MAX_URL_LENGTH = 2048
BATCH = 20  # due deliveries claimed per pass
# A claim outlives the attempt's timeout by this much: a crashed instance's claim then lapses.
LEASE_MARGIN_SECONDS = 5.0


def url_problem(url: Any) -> str | None:
    """Why ``url`` cannot be a webhook URL, or None (no DNS here: that is checked per attempt)."""
    if not isinstance(url, str) or not url:
        return "must be a non-empty string"
    if len(url) > MAX_URL_LENGTH:
        return f"must be at most {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a malformed port)
    except ValueError:
        return "must be an http:// or https:// URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL"
    if parts.username or parts.password:
        return "must not carry credentials"
    return None


def decode_secret(secret: str) -> bytes:
    """The key bytes of a ``whsec_<base64>`` secret (ValueError if malformed)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"must start with {SECRET_PREFIX!r}")
    key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    if len(key) < 16:
        raise ValueError("must hold at least 16 bytes of key")
    return key


def sign(keys: list[bytes], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: one ``v1,<signature>`` per key, space-separated (the
    current secret, then previous ones, so receivers mid-rotation verify with either)."""
    when = datetime.fromtimestamp(timestamp, tz=UTC)
    return " ".join(Webhook(key).sign(message_id, when, body) for key in keys)


def validate_section(section: dict[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for name in ("secret",):
        if section[name]:
            try:
                decode_secret(str(section[name]))
            except ValueError as exc:
                problems.append((name, f"{exc} (a whsec_-prefixed base64 key)"))
    previous = section["previous_secrets"]
    if not isinstance(previous, list) or not all(isinstance(s, str) for s in previous):
        problems.append(("previous_secrets", "must be a list of whsec_ secrets"))
    else:
        for value in previous:
            try:
                decode_secret(value)
            except ValueError as exc:
                problems.append(("previous_secrets", str(exc)))
    for name in ("url_by_agent", "url_by_actor"):
        table = section[name]
        if not isinstance(table, dict):
            problems.append((name, "must be a table of id = URL"))
            continue
        for key, url in table.items():
            problem = url_problem(url)
            if problem:
                problems.append((name, f"{key}: {problem}"))
    hosts = section["allowed_hosts"]
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        problems.append(("allowed_hosts", "must be a list of host names, addresses or networks"))
    for name in ("retry_for_seconds", "timeout_seconds", "backoff_seconds", "max_backoff_seconds", "poll_seconds"):
        value = section[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            problems.append((name, "must be a positive number of seconds"))
    if (section["url_by_agent"] or section["url_by_actor"]) and not section["secret"]:
        problems.append(("secret", "is required when default webhook URLs are set"))
    return problems


class Refused(Exception):
    """The URL's host resolves to an address the gateway will not call (SSRF protection)."""


class _Allowed:
    def __init__(self, entries: list[str]) -> None:
        self.names: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in entries:
            try:
                self.networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                self.names.add(entry.lower().rstrip("."))

    def address(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(ip in network for network in self.networks)


def _kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What makes an address one the gateway does not call by default, or None (public)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_private:
        return "private"
    if not ip.is_global or ip.is_multicast:
        return "non-public"
    return None


class _PinnedResolver(AbstractResolver):
    """Answers with the addresses already resolved and checked: the connect uses exactly them."""

    def __init__(self, results: list[ResolveResult]) -> None:
        self._results = results

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [{**result, "port": port} for result in self._results]

    async def close(self) -> None:
        return None


async def resolve_checked(host: str, port: int, allowed: _Allowed) -> list[ResolveResult]:
    """Resolve ``host`` once; raise Refused if any address is not public and not allowed."""
    name = host.lower().rstrip(".")
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        infos = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
    else:
        found = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        infos = [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found]
    if not infos:
        raise OSError(f"{host} has no address")
    results: list[ResolveResult] = []
    for family, address in dict.fromkeys(infos):
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        kind = _kind(ip)
        if kind is not None and name not in allowed.names and not allowed.address(ip):
            raise Refused(f"{host} resolves to {kind} address {ip}; list it in [webhooks] allowed_hosts to allow it")
        results.append(
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": family,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        )
    return results


def delivery_view(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A delivery row as the API shows it (``GET /v1/runs/{id}/webhook``)."""
    if row is None:
        return None
    return {
        "webhookId": row["id"],
        "url": row["url"],
        "state": row["state"],
        "attempts": row["attempts"],
        "lastStatus": row["last_status"],
        "lastError": row["last_error"],
        "firstAttemptAt": row["first_attempt_at"],
        "lastAttemptAt": row["last_attempt_at"],
        "deliveredAt": row["delivered_at"],
        "nextAttemptAt": row["next_at"] if row["state"] == "pending" and row["attempts"] else None,
    }


class Webhooks:
    """Resolves a run's webhook URL at create, and delivers the outbox's due rows."""

    def __init__(self, section: dict[str, Any], storage: Storage, executor: ThreadPoolExecutor) -> None:
        self.storage: Any = storage  # the outbox methods are the built-in journal's
        self.executor = executor
        self.keys = [decode_secret(s) for s in [section["secret"], *section["previous_secrets"]] if s]
        self.by_agent: dict[str, str] = dict(section["url_by_agent"])
        self.by_actor: dict[str, str] = dict(section["url_by_actor"])
        self.allowed = _Allowed(list(section["allowed_hosts"]))
        self.retry_for_ms = int(float(section["retry_for_seconds"]) * 1000)
        self.timeout = float(section["timeout_seconds"])
        self.backoff = float(section["backoff_seconds"])
        self.max_backoff = float(section["max_backoff_seconds"])
        self.poll = float(section["poll_seconds"])
        self.supported = hasattr(storage, "due_webhooks")
        # False: runs still get their outbox rows, but this process sends nothing (a test's
        # gateway whose fuzzed URLs must not be resolved).
        self.enabled_for_delivery = True
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.delivered = 0
        self.failed_attempts = 0

    @property
    def enabled(self) -> bool:
        return bool(self.keys) and self.supported

    def url_for(self, actor_id: str, agent_id: str, requested: str | None) -> str | None:
        """The run's webhook: the request's, else the actor's default, else the agent's."""
        return requested or self.by_actor.get(actor_id) or self.by_agent.get(agent_id)

    def run_changed(self, run: Run) -> None:
        """A RunManager listener: a run that ended may have a delivery due now."""
        if run.is_terminal:
            self._wake.set()

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def start(self) -> None:
        if self.enabled and self.enabled_for_delivery:
            self._task = asyncio.create_task(self._loop(), name="webhooks")
        elif self.keys and not self.supported:
            log.warning("webhooks need the built-in journal's outbox: this storage has none; none are sent")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                rows: list[dict[str, Any]] = await self._db(self.storage.due_webhooks, now_ms(), BATCH)
                claimed = []
                for row in rows:
                    lease = now_ms() + int((self.timeout + LEASE_MARGIN_SECONDS) * 1000)
                    if await self._db(self.storage.claim_webhook, row["id"], now_ms(), lease):
                        claimed.append(row)
                await asyncio.gather(*(self._attempt(row) for row in claimed))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook outbox pass failed; retrying")
                rows = []
            if len(rows) >= BATCH:
                continue  # more may be due
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll)

    async def _attempt(self, row: dict[str, Any]) -> None:
        started = now_ms()
        first = row["first_attempt_at"] or started
        attempts = int(row["attempts"]) + 1
        status: int | None = None
        error: str | None = None
        refused = False
        try:
            run: Run | None = await self._db(self.storage.get_run, row["host_run_id"])
            if run is None:
                raise Refused("the run no longer exists")
            status = await self._post(row["url"], row["id"], run.to_receipt())
            if not 200 <= status < 300:
                error = f"the receiver answered HTTP {status}"
        except Refused as exc:
            refused, error = True, str(exc)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        fields: dict[str, Any] = {
            "attempts": attempts,
            "first_attempt_at": first,
            "last_attempt_at": started,
            "last_status": status,
            "last_error": error,
            "lease_until": 0,
        }
        if error is None:
            fields |= {"state": "delivered", "delivered_at": now_ms()}
            self.delivered += 1
        elif refused:
            fields["state"] = "refused"
            log.warning("webhook %s of run %s refused: %s", row["id"], row["host_run_id"], error)
        else:
            self.failed_attempts += 1
            delay = retry_delay(attempts, self.backoff, self.max_backoff)
            next_at = now_ms() + int(delay * 1000)
            if next_at - first > self.retry_for_ms:
                fields["state"] = "failed"
                log.warning(
                    "webhook %s of run %s failed after %d attempt(s): %s",
                    row["id"],
                    row["host_run_id"],
                    attempts,
                    error,
                )
            else:
                fields["next_at"] = next_at
        await self._db(functools.partial(self.storage.update_webhook, row["id"], **fields))

    async def _post(self, url: str, message_id: str, receipt: dict[str, Any]) -> int:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        pinned = await resolve_checked(host, port, self.allowed)
        body = json.dumps(receipt, separators=(",", ":")).encode()
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self.keys, message_id, timestamp, body),
            "user-agent": "agent-gateway-webhooks",
        }
        connector = aiohttp.TCPConnector(resolver=_PinnedResolver(pinned), use_dns_cache=False, force_close=True)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
            session.post(url, data=body, headers=headers, allow_redirects=False) as response,
        ):
            await response.read()
            return response.status


def retry_delay(
    attempts: int, backoff: float, max_backoff: float, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """Seconds to wait after failed attempt number ``attempts`` (1 for the first): exponential
    backoff (``backoff``, doubled per attempt, capped at ``max_backoff``) times a random factor
    between 0.5 and 1 (jitter, so receivers that come back are not hit by every sender at once)."""
    return min(max_backoff, backoff * 2 ** (attempts - 1)) * uniform(0.5, 1.0)


def new_secret() -> str:
    """A fresh ``whsec_`` secret (docs; tests)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()
