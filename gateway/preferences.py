"""Per-actor preferences: ``ai.common.*`` and ``ai.agent.<agentId>.*``, validated against the
descriptor fields (:mod:`agent_gateway.descriptors`) and kept through the storage hook
(``get_preferences`` / ``put_preferences``, called on the storage executor).

Stored as one flat object per actor, full keys to values. An actor only ever reads and writes its
own. Secret values are stored but never returned: reads show ``{"isSet": true}`` for them.

Runs use them: :meth:`Preferences.apply_run_defaults` fills a run body's missing ``agentId``
(``ai.common.defaultAgent``), ``context.refs`` (``ai.common.defaultContextRefs``) and
``options.model`` / ``options.profile`` (``ai.agent.<agentId>.model`` / ``.profile``);
:meth:`Preferences.disabled_capabilities` gives the capabilities switched off for an actor's agent,
which a run's :class:`~agent_gateway.tools.RunScope` must carry (resolved on the server when the
run starts, whatever a client cached).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from agent_gateway.descriptors import DescriptorRegistry, Descriptors, FieldError
from agent_gateway.errors import ApiError

if TYPE_CHECKING:
    from agent_gateway.journal import Journal
    from agent_gateway.storage import Storage

PREFERENCES_SCHEMA = "gateway.preferences.v1"
MAX_KEYS_PER_UPDATE = 200
# Each actor's values as last read or written: every run's creation and start reads them, and a
# storage read is a worker trip (the GIL handed over twice) on the run's path to its first event.
# Only this process writes them (`put`), unless cluster instances share the database: then every
# read goes to storage.
MAX_CACHED_ACTORS = 10_000


class _ValuesCache:
    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}
        self.writes = 0  # a read that spans a write does not fill the cache (it may be stale)

    def remember(self, actor_id: str, values: dict[str, Any]) -> None:
        if actor_id not in self.values and len(self.values) >= MAX_CACHED_ACTORS:
            del self.values[next(iter(self.values))]  # the oldest entry: bounded for many actors
        self.values[actor_id] = dict(values)


def visible_values(registry: DescriptorRegistry, values: Mapping[str, Any], admin: bool) -> dict[str, Any]:
    """What the actor may see: known keys, admin fields only for admins, no secret values."""
    shown: dict[str, Any] = {}
    secrets: dict[str, Any] = {}
    for key, value in values.items():
        spec = registry.field(key)
        if spec is None or (spec.auth == "admin" and not admin):
            continue
        if spec.secret:
            secrets[key] = {"isSet": True}
        else:
            shown[key] = value
    return {"values": shown, "secrets": secrets}


def validate_update(registry: DescriptorRegistry, updates: Any, admin: bool) -> dict[str, Any]:
    """Check a PUT body's ``values``: every key a known field, every value of its kind (null
    removes the key). Raises :class:`ApiError` 400 (unknown key, wrong type) or 403 (admin-only)."""
    if not isinstance(updates, dict):
        raise ApiError(400, "invalid_request", "values must be an object of preference keys to values")
    if len(updates) > MAX_KEYS_PER_UPDATE:
        raise ApiError(400, "invalid_request", f"at most {MAX_KEYS_PER_UPDATE} keys per update")
    clean: dict[str, Any] = {}
    for key, value in updates.items():
        spec = registry.field(key)
        if spec is None or (spec.auth == "admin" and not admin and spec.key.startswith("ai.")):
            if spec is not None:
                raise ApiError(403, "admin_only", f"{key} is an admin-only setting")
            scope_hint = "keys are ai.common.<name> or ai.agent.<agentId>.<name> declared by the agent descriptors"
            raise ApiError(
                400, "unknown_preference", f"unknown preference key {key[:120]!r}; {scope_hint}", key=key[:120]
            )
        if value is None:
            clean[key] = None
            continue
        try:
            clean[key] = spec.check(value)
        except FieldError as exc:
            raise ApiError(400, "invalid_preference", str(exc), key=key, expectedKind=spec.kind) from exc
    return clean


class Preferences:
    """One gateway's preferences service: reads and writes actors' values (cached unless cluster
    instances share the database), and what runs and descriptors derive from them."""

    def __init__(
        self,
        descriptors: Descriptors,
        storage: Storage,
        journal: Journal,
        executor: Executor,
        agent_ids: Collection[str],
        *,
        cached: bool = True,
    ) -> None:
        self.descriptors = descriptors
        self.storage = storage
        self.journal = journal
        self.executor = executor
        self.agent_ids = agent_ids
        self._cache = _ValuesCache() if cached else None
        self._locks: dict[str, asyncio.Lock] = {}

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def load_values(self, actor_id: str) -> dict[str, Any]:
        """The actor's stored values (full keys), secrets included: for server-side use only."""
        cache = self._cache
        if cache is None:
            stored = await self._db(self.storage.get_preferences, actor_id)
            return dict(stored) if isinstance(stored, Mapping) else {}
        cached = cache.values.get(actor_id)
        if cached is not None:
            return dict(cached)
        writes = cache.writes
        stored = await self._db(self.storage.get_preferences, actor_id)
        values = dict(stored) if isinstance(stored, Mapping) else {}
        if cache.writes == writes:
            cache.remember(actor_id, values)
        return values

    async def get(self, actor_id: str) -> dict[str, Any]:
        """What ``GET /v1/preferences`` answers."""
        registry = await self.descriptors.registry()
        values = await self.load_values(actor_id)
        return {
            "schema": PREFERENCES_SCHEMA,
            "actorId": actor_id,
            **visible_values(registry, values, self.descriptors.is_admin(actor_id)),
        }

    async def put(self, actor_id: str, updates: Any) -> dict[str, Any]:
        """Merge ``updates`` into the actor's preferences (null removes a key); returns what GET would."""
        registry = await self.descriptors.registry()
        admin = self.descriptors.is_admin(actor_id)
        clean = validate_update(registry, updates, admin)
        lock = self._locks.setdefault(actor_id, asyncio.Lock())
        async with lock:
            values = await self.load_values(actor_id)
            for key, value in clean.items():
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
            cache = self._cache
            if cache is not None:  # stored or not (a failed write may have landed): read it again
                cache.writes += 1
                cache.values.pop(actor_id, None)
            await self.journal.write(self.storage.put_preferences, actor_id, values)
            if cache is not None:
                cache.writes += 1
                cache.remember(actor_id, values)
        return {"schema": PREFERENCES_SCHEMA, "actorId": actor_id, **visible_values(registry, values, admin)}

    async def disabled_capabilities(self, actor_id: str, agent_id: str) -> frozenset[str]:
        """The capabilities switched off for ``actor_id``'s runs of ``agent_id`` (agent-scope
        switch wins over ``ai.common``; tool capabilities of an agent without tool access count as
        off). Call it when a run starts and pass it to the tool facade's ``scope_for(run,
        disabled_capabilities=...)`` (:meth:`agent_gateway.tools.ToolFacade.scope_for`)."""
        registry = await self.descriptors.registry()
        values = await self.load_values(actor_id)
        return registry.disabled_capabilities(agent_id, values)

    async def describe_agents(self, actor_id: str, agent_id: str | None = None) -> list[dict[str, Any]]:
        """The agent descriptors ``actor_id`` sees, with its values and switches."""
        values = await self.load_values(actor_id)
        return await self.descriptors.describe(actor_id, values, agent_id)

    async def apply_run_defaults(self, actor_id: str, body: Any) -> Any:
        """Fill a run body's missing parts from the actor's preferences (a new dict; anything the
        client sent wins). Bodies that are not objects are returned unchanged for the validator."""
        if not isinstance(body, dict):
            return body
        values = await self.load_values(actor_id)
        out = dict(body)
        default_agent = values.get("ai.common.defaultAgent")
        if out.get("agentId") in (None, "") and isinstance(default_agent, str) and default_agent in self.agent_ids:
            out["agentId"] = default_agent
        context = out.get("context")
        refs = values.get("ai.common.defaultContextRefs")
        if (context is None or isinstance(context, dict)) and isinstance(refs, list):
            context = dict(context or {})
            if "refs" not in context:
                context["refs"] = list(refs)
                out["context"] = context
        agent_id = out.get("agentId")
        options = out.get("options")
        if isinstance(agent_id, str) and (options is None or isinstance(options, dict)):
            options = dict(options or {})
            changed = False
            for name in ("model", "profile"):
                value = values.get(f"ai.agent.{agent_id}.{name}")
                if name not in options and isinstance(value, str) and value:
                    options[name] = value
                    changed = True
            if changed:
                out["options"] = options
        return out
