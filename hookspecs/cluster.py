"""Cluster family: how several gateway instances on one database share the work."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_gateway.hookspecs.markers import hookspec

if TYPE_CHECKING:
    from agent_gateway.cluster import Coordinator
    from agent_gateway.config import Config


@hookspec(firstresult=True)
def cluster_coordinator(config: Config) -> Coordinator | None:
    """Return an :class:`agent_gateway.Coordinator` when this gateway is one instance of a
    cluster (the built-in ``cluster_redis`` plugin does when ``[cluster] redis_url`` is set), or
    None. Raise :class:`agent_gateway.PluginError` with a one-line reason when the configuration
    asks for a cluster this plugin cannot serve (e.g. SQLite storage).

    First non-None result wins. None from every plugin: a single instance (the default, in
    process: :class:`agent_gateway.Coordinator` itself). Called once at start-up, after
    ``storage_backend``.
    """
