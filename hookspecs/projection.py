"""Event projection family: views of a run's journal for a client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_gateway.hookspecs import hookspec


@hookspec
def register_projections(register: Callable[[str, Callable[[Any], Any]], None]) -> None:
    """Register event projections.

    Call ``register(name, project)``; ``project(event)`` gets a :class:`gateway.models.Event` and
    returns the JSON-able object a client of that projection sees, or None to hide the event.
    Clients pick one with ``?projection=<name>`` on the events and stream routes; the built-in
    ``ui`` projection is the wire form of the event. Called once when the app is created.
    """
