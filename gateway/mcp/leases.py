"""MCP credentials: lease tokens bound to an agent binding (or a run), good only during a run.

A live ACP binding keeps its agent session, and the MCP server configuration it was given at
``session/new``, across many runs. So the token handed to the agent is not a run's: it is a
*lease* held by the binding. Every call resolves the lease to the binding's run that is active
*right now* and is attributed to it (actor, workspace, allowed roots, agent session, model).
Between runs there is no active run and every call is refused; once the binding closes (its
``alive`` check fails) the lease is revoked and the token is unknown.

- Tokens are 32 random bytes, URL-safe base64 (``secrets.token_urlsafe(32)``).
- Only a SHA-256 digest of each token is used as a lookup key, and the token itself is compared
  with :func:`hmac.compare_digest`, so lookups leak nothing useful through timing.
- A lease may *pin* the run identity it was issued for (actor, workspace, allowed roots): a
  resolved run that does not match is refused. For a binding these are part of its key and
  cannot change, so a mismatch means something is wrong and the call fails closed.
- Leases live in memory: a gateway restart invalidates every token (the agent processes that
  held them are gone too).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent_gateway.models import Run
from agent_gateway.tools import RunScope

log = logging.getLogger("agent_gateway.mcp.leases")

MAX_SESSIONS_PER_LEASE = 32

NO_ACTIVE_RUN = "no active run for this token"
UNKNOWN_TOKEN = "unknown or revoked MCP token"


class LeaseError(Exception):
    """A token that does not authorise a call right now. ``reason`` is ``"unknown_token"`` or
    ``"no_active_run"`` (or ``"scope_mismatch"``); ``str(exc)`` is safe to show the caller."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


Resolved = Run | RunScope | None


def run_pin(run: Run) -> tuple[str, str, tuple[str, ...]]:
    """The identity a lease may pin: actor, workspace and the (sorted) allowed roots."""
    roots = (run.request.get("context") or {}).get("allowedRoots") or []
    return run.actor_id, run.workspace_id, tuple(sorted(r for r in roots if isinstance(r, str)))


@dataclass
class Lease:
    token: str
    key: Hashable
    resolve_active_run: Callable[[], Resolved]
    alive: Callable[[], bool] | None = None
    pin: tuple[str, str, tuple[str, ...]] | None = None
    # Mcp-Session-Id values issued on `initialize` over HTTP (oldest first, bounded).
    sessions: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def is_alive(self) -> bool:
        if self.alive is None:
            return True
        try:
            return bool(self.alive())
        except Exception:
            log.exception("an MCP lease's alive check failed; revoking it")
            return False

    def add_session(self, session_id: str) -> None:
        self.sessions[session_id] = None
        while len(self.sessions) > MAX_SESSIONS_PER_LEASE:
            self.sessions.popitem(last=False)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class McpLeases:
    """Issues, resolves and revokes MCP lease tokens.

    ``scope_for(run)`` builds a :class:`RunScope` for a resolved run (normally
    ``ToolFacade.scope_for``); a resolver may also return a ready :class:`RunScope` itself (to set
    the agent session id or model)."""

    def __init__(self, scope_for: Callable[[Run], RunScope]) -> None:
        self._scope_for = scope_for
        self._by_digest: dict[bytes, Lease] = {}
        self._by_key: dict[Hashable, bytes] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def issue(
        self,
        key: Hashable,
        resolve_active_run: Callable[[], Resolved],
        *,
        alive: Callable[[], bool] | None = None,
        pin: tuple[str, str, tuple[str, ...]] | None = None,
    ) -> str:
        """A token for ``key``. Issuing again for a key whose lease is still alive returns the same
        token (a binding that loads a session again keeps its lease) with the new resolver (and the
        new ``alive`` / ``pin`` when given).

        ``resolve_active_run()`` returns the run (or scope) to attribute a call to, or None when
        none of the holder's runs is active. ``alive()`` returning False revokes the lease for good
        (e.g. the binding closed). ``pin`` (see :func:`run_pin`) refuses any other run identity."""
        self.prune()
        digest = self._by_key.get(key)
        lease = self._by_digest.get(digest) if digest is not None else None
        if lease is not None and lease.is_alive():
            lease.resolve_active_run = resolve_active_run
            if alive is not None:
                lease.alive = alive
            if pin is not None:
                lease.pin = pin
            return lease.token
        if lease is not None:
            self._drop(lease)
        token = secrets.token_urlsafe(32)
        lease = Lease(token, key, resolve_active_run, alive, pin)
        self._by_digest[_digest(token)] = lease
        self._by_key[key] = _digest(token)
        return token

    def lease(self, token: str | None) -> Lease:
        """The live lease for ``token``; :class:`LeaseError` ``unknown_token`` otherwise."""
        if not token:
            raise LeaseError("unknown_token", UNKNOWN_TOKEN)
        lease = self._by_digest.get(_digest(token))
        if lease is None or not hmac.compare_digest(lease.token.encode(), token.encode("utf-8", "surrogatepass")):
            raise LeaseError("unknown_token", UNKNOWN_TOKEN)
        if not lease.is_alive():
            self._drop(lease)
            raise LeaseError("unknown_token", UNKNOWN_TOKEN)
        return lease

    def resolve(self, token: str | None) -> RunScope:
        """The scope of the run ``token`` may act for right now, or :class:`LeaseError`."""
        return self.scope_of(self.lease(token))

    def scope_of(self, lease: Lease) -> RunScope:
        try:
            resolved = lease.resolve_active_run()
        except Exception:
            log.exception("an MCP lease's run resolver failed")
            resolved = None
        if resolved is None:
            raise LeaseError("no_active_run", NO_ACTIVE_RUN)
        scope = resolved if isinstance(resolved, RunScope) else self._scope_for(resolved)
        if scope.run.is_terminal:
            raise LeaseError("no_active_run", NO_ACTIVE_RUN)
        if lease.pin is not None and run_pin(scope.run) != lease.pin:
            log.warning("MCP lease %r resolved to run %s of another scope; refused", lease.key, scope.run.host_run_id)
            raise LeaseError("scope_mismatch", NO_ACTIVE_RUN)
        return scope

    def revoke(self, token: str) -> bool:
        """Forget ``token``; True if it was known."""
        lease = self._by_digest.get(_digest(token))
        if lease is None:
            return False
        self._drop(lease)
        return True

    def revoke_key(self, key: Hashable) -> bool:
        digest = self._by_key.get(key)
        lease = self._by_digest.get(digest) if digest is not None else None
        if lease is None:
            return False
        self._drop(lease)
        return True

    def prune(self) -> int:
        """Revoke every lease whose holder is gone; how many were."""
        dead = [lease for lease in self._by_digest.values() if not lease.is_alive()]
        for lease in dead:
            self._drop(lease)
        return len(dead)

    def leases(self) -> Iterable[Lease]:
        return list(self._by_digest.values())

    def _drop(self, lease: Lease) -> None:
        digest = _digest(lease.token)
        self._by_digest.pop(digest, None)
        if self._by_key.get(lease.key) == digest:
            del self._by_key[lease.key]

    def describe(self) -> dict[str, Any]:
        return {"leases": len(self._by_digest)}
