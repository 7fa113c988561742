"""Event projection family: views of a run's journal for a client."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.models import Event

Projection = Callable[["Event"], Any]


@hookspec
def register_projections(register: Callable[[str, Projection], None]) -> None:
    """Register event projections.

    Call ``register(name, project)``; ``project(event)`` gets an :class:`agent_gateway.Event` and
    returns the JSON-able object a client of that projection sees, or None to hide the event.
    Clients pick one with ``?projection=<name>`` on the events and stream routes; the built-in
    ``ui`` projection is the wire form of the event. Called once when the app is created.
    """
