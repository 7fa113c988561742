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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from agent_gateway.models import Event, Run
    from agent_gateway.storage import Storage

T = TypeVar("T")


class ClusterInstance(Protocol):
    """What a coordinator may use of the gateway instance it belongs to (handed to
    :meth:`Coordinator.start`): publish events to this instance's streams or make them re-read,
    run forwarded operations, and look at (or give up) this instance's own runs and journal.
    Nothing else of the gateway is reachable from a coordinator."""

    @property
    def base_url(self) -> str | None:
        """This instance's own URL (where other instances and agents reach it), None while unknown."""
        ...

    # -- publish and resync: this instance's streams
    def publish(self, topic: str, events: list[Event]) -> None:
        """Deliver ``events`` (one run's, in order, committed by another instance) to the streams
        of ``topic`` (a run id) here."""
        ...

    def has_streams(self, topic: str) -> bool:
        """Whether any stream here follows ``topic``."""
        ...

    def resync(self, topic: str | None = None) -> None:
        """Make the streams of ``topic`` (every stream: None) re-read their run from storage."""
        ...

    # -- forward: operations another instance asked this one (the session's owner) to do
    async def create_run(self, actor_id: str, body: Any) -> tuple[Run, bool]:
        """Create a run as ``POST /v1/runs`` does; returns it and whether it is new."""
        ...

    async def cancel_run(self, host_run_id: str, actor_id: str) -> Run | None:
        """Cancel a run as ``POST /v1/runs/{id}/cancel`` does."""
        ...

    async def resolve_permission(self, host_run_id: str, actor_id: str, request_id: str, option_id: Any) -> None:
        """Answer a run's open permission request."""
        ...

    # -- this instance's runs and journal
    def active_run_ids(self) -> list[str]:
        """The runs executing on this instance."""
        ...

    def abandon_runs(self) -> None:
        """Stop every active run without waiting (the lease is lost: their new owner ends them)."""
        ...

    async def flush_journal(self) -> None:
        """Wait until every event appended so far is committed."""
        ...

    @property
    def journal_pending(self) -> int:
        """Events appended and not yet committed."""
        ...

    @property
    def fenced_events(self) -> int:
        """Events the journal dropped because a write raised :class:`NotOwner`."""
        ...

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call (a database query) on the gateway's storage executor."""
        ...


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

    async def start(self, instance: ClusterInstance) -> None:
        """The gateway's storage is open and its journal started; runs are not yet recovered.
        ``instance`` is all a coordinator may use of this gateway instance."""

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
