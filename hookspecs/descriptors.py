"""Agent descriptor family: settings fields plugins declare for agents and the common scope."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.config import Config


@hookspec
def register_setting_fields(register: Callable[[dict[str, Any]], None], config: Config) -> None:
    """Declare settings fields; they appear in ``GET /v1/agents`` descriptors and are what
    ``PUT /v1/preferences`` accepts. ``config`` is the loaded :class:`agent_gateway.Config`.

    Call ``register(field)`` with a dict:

    - ``key``: ``"ai.common.<name>"`` (one value for every agent) or ``"ai.agent.*.<name>"``
      (declared once, offered per agent as ``ai.agent.<agentId>.<name>``);
    - ``label``, ``kind`` (``select`` | ``string`` | ``boolean`` | ``integer`` | ``string_list``),
      ``default``;
    - ``options`` (a static list for ``select``) and/or ``optionsSource`` (a name the host
      resolves, e.g. ``"agents"``);
    - ``auth``: ``"user"`` (default) or ``"admin"`` (filtered out on the server for others);
    - ``secret``: True for keys and tokens: never returned in clear, only ``isSet``;
    - ``capabilityIds`` (optional): the field is hidden when one of them is disabled;
    - ``description`` (optional);
    - ``schema`` (optional): a JSON Schema (Draft 2020-12) values must also satisfy, checked when
      the descriptors are built (an invalid one is an error naming the field) and enforced with
      ``jsonschema``.

    A runtime declares its own per-agent fields in ``describe()["fields"]`` instead (keys without
    the ``ai.agent.<agentId>.`` prefix). Called once, lazily, when descriptors are first built.
    All implementations are called.
    """
