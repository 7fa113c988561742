"""Agent descriptors (``gateway.agent_descriptor.v1``) and the settings fields behind them.

A descriptor is merged, per agent and per calling actor, from:

1. the runtime's static registry: ``runtime.describe()`` (capabilities, fields, availability) and
   its negotiated :class:`~agent_gateway.runtime.RuntimePolicy`;
2. the tool manifest (``agent_gateway.tools``): every tool an agent can reach through the MCP surface,
   with its capability ids; agents without tool access (``describe()["toolAccess"]`` false, or no
   ``files``/``tools``/``mcp`` capability) get none;
3. fields plugins declare with the ``register_setting_fields`` hook, plus the core's common
   fields (default agent, default context refs, one ``enabled`` switch per capability);
4. the actor's preferences (:mod:`agent_gateway.preferences`): values, capability switches.

Field keys are full preference keys: ``ai.common.<name>`` or ``ai.agent.<agentId>.<name>``.
Secret fields never carry a value, only ``isSet``; admin-only fields (``auth: "admin"``) are left
out for actors that are not admins (``[auth] admins``; with no authentication configured the single local
actor is the admin). A capability switched off is absent from ``capabilities``, reported in
``capabilityStates`` and its tools show ``enabled: false``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_gateway.json_schema import SchemaValidator, compile_schema, error_message, first_error

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

    from agent_gateway.tools import Tool

log = logging.getLogger("agent_gateway.descriptors")

DESCRIPTOR_SCHEMA = "gateway.agent_descriptor.v1"
DESCRIPTORS_SCHEMA = "gateway.agent_descriptors.v1"
COMMON = "ai.common"
AGENT_TEMPLATE = "ai.agent.*."
FIELD_KINDS = ("select", "string", "boolean", "integer", "string_list")
AUTH_LEVELS = ("user", "admin")
CONTEXT_REFS = ("current_page", "selection", "allowed_roots")
TOOL_ACCESS_CAPABILITIES = frozenset({"files", "tools", "mcp"})
# How long an agent's availability (a binary lookup) is believed when runs are created.
AVAILABILITY_TTL_SECONDS = 10.0


def agent_scope(agent_id: str) -> str:
    return f"ai.agent.{agent_id}"


def capability_key(scope: str, capability: str) -> str:
    return f"{scope}.capabilities.{capability}.enabled"


# The JSON range of an integer setting (values beyond 64 bits are not JSON the gateway parses).
INT64 = {"minimum": -(2**63) + 1, "maximum": 2**63 - 1}


class FieldError(ValueError):
    """A value does not fit its field (message names the key and what was expected)."""


def kind_schema(kind: str, options: tuple[Any, ...] | None) -> dict[str, Any]:
    """The JSON Schema of a value of ``kind`` (restricted to ``options`` when given)."""
    allowed = list(options) if options is not None else None
    if kind == "string_list":
        item: dict[str, Any] = {"type": "string"} if allowed is None else {"type": "string", "enum": allowed}
        return {"type": "array", "items": item, "maxItems": 100}
    kinds: dict[str, dict[str, Any]] = {
        "boolean": {"type": "boolean"},
        "integer": {"type": "integer", **INT64},
        "string": {"type": "string", "maxLength": 10_000},
    }
    schema = kinds.get(kind, {"type": "string"})
    return schema if allowed is None else {**schema, "enum": allowed}


@dataclass(frozen=True)
class FieldSpec:
    key: str
    label: str
    kind: str
    default: Any = None
    options: tuple[Any, ...] | None = None
    options_source: str | None = None
    auth: str = "user"
    secret: bool = False
    capability_ids: tuple[str, ...] = ()
    description: str = ""
    agent_id: str | None = None  # None: ai.common
    # A JSON Schema the value must satisfy beyond its kind and options (declared as "schema").
    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    # Validators of the kind (and options) and of the declared schema, built once when the field
    # is declared: an invalid schema is refused then, naming the field.
    _kind_validator: SchemaValidator = field(init=False, repr=False, compare=False)
    _schema_validator: SchemaValidator | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = f"settings field {self.key!r}" + (f" of agent {self.agent_id!r}" if self.agent_id else "")
        own = compile_schema(kind_schema(self.kind, self.options), owner)
        declared = None if self.schema is None else compile_schema(self.schema, f"{owner}: schema")
        object.__setattr__(self, "_kind_validator", own)
        object.__setattr__(self, "_schema_validator", declared)

    @property
    def value_schema(self) -> dict[str, Any]:
        """The JSON Schema of a value: its kind's (and options'), and the declared ``schema``
        (as a resource of its own, so its ``#`` references keep pointing into it)."""
        own = kind_schema(self.kind, self.options)
        if self.schema is None:
            return own
        return {"allOf": [own, {"$id": f"urn:agent-gateway:setting:{self.key}", **self.schema}]}

    @property
    def scope(self) -> str:
        return COMMON if self.agent_id is None else agent_scope(self.agent_id)

    @classmethod
    def from_declaration(cls, raw: Mapping[str, Any], *, prefix: str = "", agent_id: str | None = None) -> FieldSpec:
        key = raw.get("key")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a settings field needs a key: {dict(raw)!r:.200}")
        kind = raw.get("kind", "string")
        if kind not in FIELD_KINDS:
            raise ValueError(f"field {key!r}: kind must be one of {', '.join(FIELD_KINDS)}, not {kind!r}")
        auth = raw.get("auth", "user")
        if auth not in AUTH_LEVELS:
            raise ValueError(f"field {key!r}: auth must be user or admin")
        options = raw.get("options")
        return cls(
            key=prefix + key,
            label=str(raw.get("label") or key),
            kind=kind,
            default=raw.get("default"),
            options=tuple(options) if isinstance(options, (list, tuple)) else None,
            options_source=raw.get("optionsSource"),
            auth=auth,
            secret=bool(raw.get("secret", False)),
            capability_ids=tuple(raw.get("capabilityIds") or ()),
            description=str(raw.get("description") or ""),
            agent_id=agent_id,
            schema=raw.get("schema"),
        )

    def check(self, value: Any) -> Any:
        """Validate (and return) a value for this field against its kind and options, then its
        declared ``schema`` (:attr:`value_schema`); raises :class:`FieldError` naming the key."""
        if self.kind == "integer" and isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
            value = int(value)  # JSON does not tell 3.0 from 3 (nor does JSON Schema's "integer")
        error = first_error(self._kind_validator, value)
        if error is not None:
            raise FieldError(self._kind_message(value, error))
        if self._schema_validator is not None:
            error = first_error(self._schema_validator, value)
            if error is not None:  # the declared schema: the place named below the key
                raise FieldError(error_message(error, self.key))
        return value

    def _kind_message(self, value: Any, error: ValidationError) -> str:
        """What a value of the wrong kind or outside the options is told (one sentence per kind)."""
        if error.validator == "enum" and self.options is not None:
            items = value if isinstance(value, list) else [value]
            bad = next((v for v in items if v not in self.options), value)
            return f"{self.key}: {bad!r} is not one of {', '.join(repr(o) for o in self.options)}"
        if self.kind == "boolean":
            return f"{self.key} must be true or false"
        if self.kind == "integer":
            return f"{self.key} must be an integer (64-bit)"
        if self.kind == "string_list":
            return f"{self.key} must be a list of strings (at most 100)"
        if isinstance(value, str):
            return f"{self.key} is longer than 10000 characters"
        return f"{self.key} must be a string"

    def to_wire(self, values: Mapping[str, Any]) -> dict[str, Any]:
        is_set = self.key in values
        out: dict[str, Any] = {
            "key": self.key,
            "label": self.label,
            "kind": self.kind,
            "default": None if self.secret else self.default,
            "optionsSource": self.options_source,
            "options": list(self.options) if self.options is not None else None,
            "auth": self.auth,
            "secret": self.secret,
            "scope": self.scope,
            "isSet": is_set,
        }
        if not self.secret:
            out["value"] = values[self.key] if is_set else self.default
        if self.capability_ids:
            out["capabilityIds"] = list(self.capability_ids)
        if self.description:
            out["description"] = self.description
        if self.schema is not None:
            out["schema"] = self.schema
        return out


@dataclass
class AgentStatic:
    agent_id: str
    capabilities: list[str]  # the runtime's own plus those of the tools it reaches
    tool_access: bool
    fields: list[FieldSpec] = field(default_factory=list)


class DescriptorRegistry:
    """The static part of every descriptor, built once per gateway (see :meth:`Descriptors.registry`)."""

    def __init__(
        self,
        runtimes: Mapping[str, Any],
        tools: Mapping[str, Tool],
        declared: Iterable[Mapping[str, Any]] = (),
        availability: AgentAvailability | None = None,
    ) -> None:
        self.runtimes = runtimes
        self.tools = tools
        # Where each descriptor's availability is kept for run creation too.
        self.availability = availability
        tool_caps = sorted({c for t in self.tools.values() for c in t.capability_ids})
        self.agents: dict[str, AgentStatic] = {}
        self.common: list[FieldSpec] = []
        agent_ids = sorted(runtimes)
        all_caps: set[str] = set(tool_caps)
        for agent_id in agent_ids:
            runtime = runtimes[agent_id]
            described = _describe(runtime)
            own = [c for c in described.get("capabilities") or [] if isinstance(c, str)]
            access = described.get("toolAccess")
            tool_access = bool(access) if access is not None else bool(TOOL_ACCESS_CAPABILITIES & set(own))
            caps = list(dict.fromkeys(own + (tool_caps if tool_access else [])))
            all_caps.update(caps)
            static = AgentStatic(agent_id, caps, tool_access)
            scope = agent_scope(agent_id) + "."
            for raw in described.get("fields") or []:
                try:
                    key = str(raw.get("key", ""))
                    spec = FieldSpec.from_declaration(
                        raw, prefix="" if key.startswith(scope) else scope, agent_id=agent_id
                    )
                    if not spec.key.startswith(scope):
                        raise ValueError(f"{spec.key!r} is outside {scope}*")
                    static.fields.append(spec)
                except (ValueError, AttributeError) as exc:
                    log.warning("agent %s declares a bad field: %s", agent_id, exc)
            for raw in declared:
                if str(raw.get("key", "")).startswith(AGENT_TEMPLATE):
                    renamed = {**raw, "key": str(raw["key"])[len(AGENT_TEMPLATE) :]}
                    static.fields.append(FieldSpec.from_declaration(renamed, prefix=scope, agent_id=agent_id))
            for cap in caps:
                static.fields.append(
                    FieldSpec(
                        capability_key(agent_scope(agent_id), cap),
                        f"Enable {cap} for this agent",
                        "boolean",
                        True,
                        capability_ids=(),
                        description="Unset: follows ai.common; set: overrides it for this agent.",
                        agent_id=agent_id,
                    )
                )
            self.agents[agent_id] = static
        self.common.append(
            FieldSpec(
                "ai.common.defaultAgent",
                "Default agent",
                "select",
                agent_ids[0] if agent_ids else None,
                options=tuple(agent_ids),
                options_source="agents",
                description="The agent a run uses when it names none.",
            )
        )
        self.common.append(
            FieldSpec(
                "ai.common.defaultContextRefs",
                "Default context",
                "string_list",
                ["current_page"],
                options=CONTEXT_REFS,
                options_source="context_refs",
                description="What a run carries as context when the client sends none.",
            )
        )
        for cap in sorted(all_caps):
            self.common.append(FieldSpec(capability_key(COMMON, cap), f"Enable {cap}", "boolean", True))
        for raw in declared:
            key = str(raw.get("key", ""))
            if key.startswith(COMMON + "."):
                self.common.append(FieldSpec.from_declaration(raw))
            elif not key.startswith(AGENT_TEMPLATE):
                log.warning("settings field %r ignored: keys start with ai.common. or ai.agent.*.", key)
        self._by_key: dict[str, FieldSpec] = {}
        for spec in self.common + [f for a in self.agents.values() for f in a.fields]:
            if spec.key in self._by_key:
                log.warning("settings field %r declared twice; the first wins", spec.key)
                continue
            self._by_key[spec.key] = spec

    # -- lookups ----------------------------------------------------------------------------------
    def field(self, key: str) -> FieldSpec | None:
        return self._by_key.get(key)

    def fields(self) -> list[FieldSpec]:
        return list(self._by_key.values())

    def capability_states(self, agent_id: str, values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``{capId: {"enabled", "source"}}``: the agent-scope switch wins over the common one."""
        static = self.agents.get(agent_id)
        states: dict[str, dict[str, Any]] = {}
        for cap in static.capabilities if static else []:
            agent_key = capability_key(agent_scope(agent_id), cap)
            common_key = capability_key(COMMON, cap)
            if isinstance(values.get(agent_key), bool):
                states[cap] = {"enabled": values[agent_key], "source": agent_key}
            elif isinstance(values.get(common_key), bool):
                states[cap] = {"enabled": values[common_key], "source": common_key}
            else:
                states[cap] = {"enabled": True, "source": "default"}
        return states

    def disabled_capabilities(self, agent_id: str, values: Mapping[str, Any]) -> frozenset[str]:
        """Capabilities switched off for this agent, including those of tools it cannot reach
        at all (a tool-less agent gets every tool capability disabled)."""
        states = self.capability_states(agent_id, values)
        off = {cap for cap, state in states.items() if not state["enabled"]}
        static = self.agents.get(agent_id)
        if static is None or not static.tool_access:
            off.update(c for t in self.tools.values() for c in t.capability_ids)
        return frozenset(off)

    def _availability(self, agent_id: str, described: Mapping[str, Any]) -> dict[str, Any]:
        """The descriptor's availability, kept for run creation too (it was just computed)."""
        availability = availability_of(described)
        if self.availability is not None:
            self.availability.store(agent_id, availability)
        return availability

    # -- the descriptor ----------------------------------------------------------------------------
    def describe(self, agent_id: str, values: Mapping[str, Any], *, admin: bool) -> dict[str, Any]:
        runtime = self.runtimes[agent_id]
        static = self.agents[agent_id]
        described = _describe(runtime)
        states = self.capability_states(agent_id, values)
        disabled = {cap for cap, state in states.items() if not state["enabled"]}

        def visible(specs: Iterable[FieldSpec]) -> list[dict[str, Any]]:
            out = []
            for spec in specs:
                if spec.auth == "admin" and not admin:
                    continue
                wire = spec.to_wire(values)
                if set(spec.capability_ids) & disabled:
                    wire["disabled"] = True
                out.append(wire)
            return out

        tools = []
        if static.tool_access:
            for tool in self.tools.values():
                off = sorted(set(tool.capability_ids) & disabled)
                entry: dict[str, Any] = {
                    "name": tool.name,
                    "capabilityIds": list(tool.capability_ids),
                    "enabled": not off,
                }
                if off:
                    entry["disabledBy"] = [states[c]["source"] for c in off]
                tools.append(entry)
        refs = values.get("ai.common.defaultContextRefs")
        policy = getattr(runtime, "policy", None)
        extra = {
            k: v
            for k, v in described.items()
            if k not in ("capabilities", "availability", "fields", "toolAccess") and not k.startswith("_")
        }
        return {
            "schema": DESCRIPTOR_SCHEMA,
            "agentId": agent_id,
            "displayName": getattr(runtime, "display_name", agent_id),
            "provider": getattr(runtime, "provider", None),
            "capabilities": [c for c in static.capabilities if c not in disabled],
            "capabilityStates": states,
            "defaultContextRefs": list(refs) if isinstance(refs, list) else ["current_page"],
            "settingScopes": [COMMON, agent_scope(agent_id)],
            "fields": visible(self.common) + visible(static.fields),
            "tools": tools,
            "toolAccess": static.tool_access,
            "policy": policy.to_wire() if policy is not None else {},
            "availability": self._availability(agent_id, described),
            "isDefault": values.get("ai.common.defaultAgent") == agent_id,
            **extra,
        }


def availability_of(described: Mapping[str, Any]) -> dict[str, Any]:
    """A ``describe()`` result's availability, always with ``available`` (a runtime that says
    nothing is available; one that only says ``binaryFound: false`` is not), and with a
    ``reason`` when it is not available."""
    raw = described.get("availability")
    availability = dict(raw) if isinstance(raw, Mapping) else {}
    available = availability.get("available")
    if not isinstance(available, bool):
        available = availability.get("binaryFound") is not False
    availability["available"] = available
    reason = availability.get("reason")
    if not available and (not isinstance(reason, str) or not reason):
        availability["reason"] = "the runtime reports itself unavailable (see the gateway log)"
    return availability


class AgentAvailability:
    """Each agent's availability for run creation, from its runtime's ``describe()`` (a binary
    lookup), computed off the event loop at most once per ``ttl`` seconds per agent: creating a run
    costs no filesystem lookup while the answer is fresh. ``GET /v1/agents`` refreshes it too."""

    def __init__(self, runtimes: Mapping[str, Any], executor: Any, ttl: float = AVAILABILITY_TTL_SECONDS) -> None:
        self.runtimes = runtimes
        self.executor = executor
        self.ttl = ttl
        self._known: dict[str, tuple[float, dict[str, Any]]] = {}

    def store(self, agent_id: str, availability: dict[str, Any]) -> None:
        self._known[agent_id] = (time.monotonic() + self.ttl, availability)

    async def get(self, agent_id: str) -> dict[str, Any]:
        """``{"available", "reason", ...}`` of a registered agent (fresh within ``ttl``)."""
        known = self._known.get(agent_id)
        if known is not None and known[0] > time.monotonic():
            return known[1]
        loop = asyncio.get_running_loop()
        described = await loop.run_in_executor(self.executor, _describe, self.runtimes[agent_id])
        availability = availability_of(described)
        self.store(agent_id, availability)
        return availability


def _describe(runtime: Any) -> dict[str, Any]:
    if getattr(runtime, "describe", None) is None:
        return {}
    try:
        described = runtime.describe()
    except Exception as exc:
        log.exception("describe() of %s failed", getattr(runtime, "agent_id", "?"))
        return {"availability": {"available": False, "reason": f"describe() failed: {type(exc).__name__}"}}
    return dict(described) if isinstance(described, Mapping) else {}


class Descriptors:
    """The descriptors of one gateway's agents: the registry (built once, off the event loop:
    ``describe()`` may look up binaries; it never waits on an agent process) and who is an admin."""

    def __init__(
        self,
        runtimes: Mapping[str, Any],
        tools: Mapping[str, Tool],
        declared_fields: Callable[[], Iterable[Any]],
        executor: Executor,
        availability: AgentAvailability | None = None,
        *,
        auth_required: bool,
        admins: Iterable[str] = (),
    ) -> None:
        self.runtimes = runtimes
        self.tools = tools
        self._declared_fields = declared_fields  # the `register_setting_fields` hook
        self.executor = executor
        self.availability = availability
        self.auth_required = auth_required
        self.admins = frozenset(admins)
        self._registry: DescriptorRegistry | None = None
        self._building = asyncio.Lock()

    def _build(self) -> DescriptorRegistry:
        declared = [f for f in self._declared_fields() if isinstance(f, Mapping)]
        return DescriptorRegistry(self.runtimes, self.tools, declared, self.availability)

    async def registry(self) -> DescriptorRegistry:
        found = self._registry
        if found is not None:
            return found
        async with self._building:
            if self._registry is None:
                self._registry = await asyncio.get_running_loop().run_in_executor(self.executor, self._build)
        return self._registry

    def is_admin(self, actor_id: str) -> bool:
        """Admins are listed in ``[auth] admins``; with no authentication configured, the one
        local actor is."""
        return not self.auth_required or actor_id in self.admins

    async def describe(
        self, actor_id: str, values: Mapping[str, Any], agent_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The descriptors ``actor_id`` sees (every agent's, or ``agent_id``'s), given the actor's
        preference ``values``."""
        registry = await self.registry()
        admin = self.is_admin(actor_id)
        ids = [agent_id] if agent_id is not None else sorted(self.runtimes)

        def build() -> list[dict[str, Any]]:
            return [registry.describe(i, values, admin=admin) for i in ids]

        return await asyncio.get_running_loop().run_in_executor(self.executor, build)
