"""Who is calling, and may they: the ``authenticate`` and ``authorize`` hooks (hookspecs/auth.py).

The middleware asks :meth:`Auth.authenticate` for the caller of every non-public request and
keeps the :class:`Actor` on the request (``request[IDENTITY]``; ``request[ACTOR_ID]`` is its
id, what the routes key runs and sessions by). Routes ask :meth:`Auth.authorize` before serving
a resource. Both cost nothing beyond a flag test when no plugin takes part: with no
authentication configured every caller is the one local actor, and with no ``authorize``
implementation every action is allowed without a hook call.

The static ``[auth] tokens`` are the built-in authenticator (``agent_gateway.builtin``, tried
last); their tokens are compared without leaking, through timing, how much of a guess was right.
"""

from __future__ import annotations

import hmac
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from agent_gateway.errors import ApiError
from agent_gateway.workspace_access import workspace_not_found

if TYPE_CHECKING:
    from agent_gateway.config import Config
    from agent_gateway.models import Run
    from agent_gateway.tools import ToolCall

LOCAL_ACTOR = "local"
FORBIDDEN = "forbidden"
# Actors (with their claims) that created runs lately, for ``tools:call``: at most this many.
REMEMBERED_ACTORS = 4096


@dataclass(frozen=True)
class Actor:
    """The caller of a request, as an ``authenticate`` implementation found it.

    ``id`` keys everything the actor owns (runs, sessions, preferences). ``claims`` is what the
    authenticator knows about it, for ``authorize`` implementations: by convention ``roles`` (a
    list of role names) and ``workspaces`` (the workspace ids it may use; absent: no restriction
    beyond ``[workspaces] owners``), plus anything else (the raw claims of a JWT, say)."""

    id: str
    claims: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def roles(self) -> tuple[str, ...]:
        roles = self.claims.get("roles")
        if isinstance(roles, str):
            return (roles,)
        return tuple(r for r in roles if isinstance(r, str)) if isinstance(roles, list | tuple) else ()

    @property
    def workspaces(self) -> frozenset[str] | None:
        """The workspace ids ``claims["workspaces"]`` allows, or None when the claim is absent."""
        workspaces = self.claims.get("workspaces")
        if workspaces is None:
            return None
        if isinstance(workspaces, str):
            return frozenset(workspaces.split())  # a space-separated claim, as OAuth scopes are
        if isinstance(workspaces, list | tuple | set | frozenset):
            return frozenset(w for w in workspaces if isinstance(w, str))
        return frozenset()  # a claim of another shape allows nothing rather than everything


# Where the middleware keeps the caller: the Actor, and its id (what routes read).
IDENTITY: web.RequestKey[Actor] = web.RequestKey("identity", Actor)
ACTOR_ID: web.RequestKey[str] = web.RequestKey("actor", str)


def bearer_token(request: web.Request) -> str | None:
    """The token of the request's ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def actor_for_token(tokens: Mapping[str, str], presented: str) -> str | None:
    """The actor whose token is ``presented``, or None. Every configured token is compared in
    constant time (``hmac.compare_digest``), whichever matches, so the answer's timing says
    neither which token nor how many leading bytes matched."""
    candidate = presented.encode("utf-8", "surrogatepass")
    found: str | None = None
    for token, actor in tokens.items():
        if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), candidate):
            found = actor
    return found


def run_resource(run: Run) -> dict[str, Any]:
    """What ``authorize`` is told about a run."""
    return {
        "type": "run",
        "id": run.host_run_id,
        "agentId": run.agent_id,
        "sessionId": run.session_id,
        "workspaceId": run.workspace_id,
        "actorId": run.actor_id,
    }


class AuthHooks(Protocol):
    """The hooks :class:`Auth` asks (the plugin host's ``authenticate`` and ``authorize`` facades)."""

    def authentication_required(self, config: Config) -> bool: ...

    def authorizes(self) -> bool: ...

    def authenticate(self, request: web.Request, config: Config) -> Any: ...

    async def authorize(self, actor: Actor, action: str, resource: dict[str, Any]) -> bool: ...


class Auth:
    """Authentication and authorization for one gateway, decided once at start-up."""

    def __init__(self, config: Config, plugins: AuthHooks) -> None:
        self.plugins = plugins
        self.config = config
        # False: no authenticator is in use, every caller is the one local actor (loopback only).
        self.required = plugins.authentication_required(config)
        # False: no plugin implements authorize, so every action is allowed without asking.
        self.authorizing = plugins.authorizes()
        admins = config.section("auth").get("admins") or []
        self.local = Actor(LOCAL_ACTOR, {"roles": ["admin"]})
        # The built-in authenticator's answers, built once: one Actor per configured token.
        self._token_actors = {
            actor_id: Actor(actor_id, {"roles": ["admin"]} if actor_id in admins else {})
            for actor_id in config.tokens.values()
        }
        self.tokens = config.tokens
        # The actor of each recent run creation, as its authenticator found it (claims and all):
        # who a tool call of its run is asked about. Bounded; in this process only.
        self._creators: OrderedDict[str, Actor] = OrderedDict()

    # -- authentication -------------------------------------------------------------------------
    def static_token_actor(self, request: web.Request) -> Actor | None:
        """The built-in authenticator: the actor of a configured ``[auth] tokens`` bearer."""
        token = bearer_token(request)
        if token is None or not self.tokens:
            return None
        actor_id = actor_for_token(self.tokens, token)
        return self._token_actors.get(actor_id) if actor_id is not None else None

    def authenticate(self, request: web.Request) -> Actor | Awaitable[Actor]:
        """The caller of ``request``: an Actor, or an awaitable of one when a plugin answers
        asynchronously. Raises the 401 :class:`ApiError` when nobody vouches for it."""
        if not self.required:
            return self.local
        found = self.plugins.authenticate(request, self.config)
        if inspect.isawaitable(found):
            return self._settle(request, found)
        return self._checked(request, found)

    async def _settle(self, request: web.Request, pending: Awaitable[Any]) -> Actor:
        return self._checked(request, await pending)

    @staticmethod
    def _checked(request: web.Request, found: Any) -> Actor:
        if isinstance(found, Actor):
            return found
        if found is not None:
            raise TypeError(f"an authenticate hook returned {type(found).__name__}, not an Actor or None")
        if bearer_token(request) is None:
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        raise ApiError(401, "unauthorized", "unknown token")

    # -- authorization ----------------------------------------------------------------------------
    async def authorize(self, request: web.Request, action: str, resource: Mapping[str, Any]) -> None:
        """Raise the 403 ``forbidden`` :class:`ApiError` when an ``authorize`` hook denies the
        caller of ``request`` ``action`` on ``resource``. Call it only when :attr:`authorizing`."""
        actor: Actor = request[IDENTITY]
        if not await self.allowed(actor, action, resource):
            raise ApiError(403, FORBIDDEN, f"actor {actor.id!r} may not {action}", action=action)

    async def allowed(self, actor: Actor, action: str, resource: Mapping[str, Any]) -> bool:
        if not self.authorizing:
            return True
        return await self.plugins.authorize(actor, action, dict(resource))

    def run_create_check(self, request: web.Request) -> Callable[[dict[str, Any]], Awaitable[None]] | None:
        """What ``RunManager.create`` checks once the body is valid: the actor's ``workspaces``
        claim, then ``authorize(actor, "runs:create", ...)``; None when there is nothing to check."""
        actor: Actor = request[IDENTITY]
        workspaces = actor.workspaces
        if workspaces is None and not self.authorizing:
            return None

        async def check(run_request: dict[str, Any]) -> None:
            workspace_id = run_request["workspaceId"]
            if workspaces is not None and workspace_id not in workspaces:
                raise workspace_not_found(workspace_id)  # as [workspaces] owners refuses one
            if self.authorizing:
                self._remember(actor)
                resource = {
                    "type": "run",
                    "agentId": run_request["agentId"],
                    "sessionId": run_request["sessionId"],
                    "workspaceId": workspace_id,
                }
                await self.authorize(request, "runs:create", resource)

        return check

    def _remember(self, actor: Actor) -> None:
        self._creators[actor.id] = actor
        self._creators.move_to_end(actor.id)
        while len(self._creators) > REMEMBERED_ACTORS:
            self._creators.popitem(last=False)

    def actor_of(self, actor_id: str) -> Actor:
        """The Actor behind ``actor_id`` as this gateway last authenticated it creating a run;
        with only its id when it did not (a restart since, a run created through another instance)."""
        known = self._creators.get(actor_id) or self._token_actors.get(actor_id)
        if known is not None:
            return known
        return self.local if actor_id == LOCAL_ACTOR and not self.required else Actor(actor_id)

    async def tool_call_allowed(self, call: ToolCall) -> bool:
        """``authorize(<the run's actor>, "tools:call", {"type": "tool", ...})`` for one tool call
        of the facade (the MCP surface and the ACP file methods alike)."""
        run = call.scope.run
        resource = {
            "type": "tool",
            "id": call.name,
            "caller": call.caller,
            "runId": run.host_run_id,
            "agentId": run.agent_id,
            "sessionId": run.session_id,
            "workspaceId": run.workspace_id,
        }
        return await self.allowed(self.actor_of(run.actor_id), "tools:call", resource)

    @staticmethod
    def may_use_workspace(request: web.Request, workspace_id: str) -> bool:
        """False when the caller's ``workspaces`` claim leaves ``workspace_id`` out."""
        workspaces = request[IDENTITY].workspaces
        return workspaces is None or workspace_id in workspaces


AUTH_KEY: web.AppKey[Auth] = web.AppKey("auth", Auth)


def identity(request: web.Request) -> Actor:
    """The authenticated caller of ``request`` (set by the gateway's middleware)."""
    actor: Actor = request[IDENTITY]
    return actor
