"""Which actors may use which workspace: ``[workspaces] owners``.

With no ``owners`` configured every actor may use every workspace (as before the setting existed).
With ``owners`` set, a workspace listed there belongs to the actors it names and an unlisted
configured workspace stays shared by every actor; a workspace id that is not configured at all
is refused too, so that another actor's workspace and one that does not exist answer alike
(404 ``workspace_not_found``): nobody learns which workspace ids exist.

A run that names no workspace gets :data:`DEFAULT_WORKSPACE`. Unless ``roots`` configures it, that
id means "no workspace": it is open to every actor whether or not ``owners`` is set (a plain chat
works either way), and its file tools answer ``no_workspace``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agent_gateway.errors import ApiError

WORKSPACE_NOT_FOUND = "workspace_not_found"
# The workspace id of a run that names none.
DEFAULT_WORKSPACE = "default"


def workspace_not_found(workspace_id: str) -> ApiError:
    """The one refusal for a workspace the caller may not use, whether or not it exists."""
    return ApiError(404, WORKSPACE_NOT_FOUND, f"no configured workspace {workspace_id!r}")


@dataclass(frozen=True)
class WorkspaceAccess:
    configured: frozenset[str] = frozenset()
    owners: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, configured: Iterable[str], owners: Mapping[str, Iterable[str]]) -> WorkspaceAccess:
        return cls(frozenset(configured), {k: frozenset(v) for k, v in owners.items()})

    @property
    def restricted(self) -> bool:
        """True when an ACL is configured (``owners`` not empty)."""
        return bool(self.owners)

    def allows(self, actor_id: str, workspace_id: str) -> bool:
        if not self.owners:
            return True
        if workspace_id not in self.configured:
            return workspace_id == DEFAULT_WORKSPACE  # no workspace: nobody's, so anybody's
        actors = self.owners.get(workspace_id)
        return actors is None or actor_id in actors

    def require(self, actor_id: str, workspace_id: str) -> None:
        """Raise the 404 :func:`workspace_not_found` unless ``actor_id`` may use ``workspace_id``."""
        if not self.allows(actor_id, workspace_id):
            raise workspace_not_found(workspace_id)
