"""The coordinator: what several gateway instances sharing one database agree on.

One gateway process is its own cluster, and this module's :class:`Coordinator` is that case: it
owns every session, delivers events as the journal publishes them, and forwards nothing. A plugin
(the ``cluster_coordinator`` hook; the built-in one is ``cluster_redis``) returns a subclass for
several instances: it relays committed events to the other instances, keeps one owner per
session with a lease, fences the storage writes of an instance that lost its lease, forwards
run creation, cancel and permission answers to a session's owner, and takes over the runs of a
dead instance. The core calls it at a few points only (see ``docs/deployment.md``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_gateway.app import Gateway
    from agent_gateway.models import Event, Run
    from agent_gateway.storage import Storage


class NotOwner(Exception):
    """A write of an instance that no longer holds its lease (a fencing token that is not the
    current one). The write is refused; the run's new owner ends it."""


class Coordinator:
    """A single instance: the in-process default (changes nothing)."""

    instance_id = "local"
    # True: other instances share the storage (a session's active run may live on another one).
    clustered = False
    # True: an event reaches a client only once storage has committed it (the journal delivers
    # after its group commit instead of after spooling).
    durable_delivery = False

    def wrap_storage(self, storage: Storage) -> Storage:
        """The storage the gateway uses (a cluster wraps it to fence writes)."""
        return storage

    async def start(self, gateway: Gateway) -> None:
        """The gateway's storage is open and its journal started; runs are not yet recovered."""

    async def stop(self) -> None:
        """The gateway stopped its runs; storage is still open."""

    def committed(self, events: list[Event]) -> None:
        """``events`` (one run's, in order) are committed; called on the event loop."""

    async def session_owner(self, actor_id: str, session_id: str) -> str | None:
        """The instance that runs this session's turns: None (or this instance's id) means this
        instance, which then holds the session's lease."""
        return None

    async def forward(self, instance_id: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Ask instance ``instance_id`` to do ``op`` (``create``, ``cancel``, ``permission``) and
        return its answer; raises :class:`agent_gateway.ApiError` as the owner did."""
        raise NotImplementedError("a single gateway forwards nothing")

    async def owner_elsewhere(self, run: Run) -> str | None:
        """The live instance (other than this one) that executes ``run``, if any: such a run
        is not this instance's to repair or interrupt."""
        return None

    def status(self) -> dict[str, Any]:
        """For ``agent-gateway cluster status``, outside any running gateway (storage open,
        wrapped by :meth:`wrap_storage`; may block): ``{"instances": [{"instanceId", "alive",
        "leaseRemainingSeconds", "url", "sessions", "runs": [{"hostRunId", "status",
        "sessionId"}]}]}``."""
        return {"instances": []}

    def health(self) -> dict[str, Any] | None:
        """What ``/v1/health`` shows under ``cluster`` (None: no cluster)."""
        return None

    def metrics(self) -> list[tuple[str, str, str, list[tuple[dict[str, str], float]]]]:
        """Metric families of its own for ``/metrics``: ``(name, type, help, [(labels, value)])``,
        e.g. counters labelled by reason (numbers in :meth:`health` become gauges already)."""
        return []
