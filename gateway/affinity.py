"""Conversation affinity: the gateway session a stateless client's resent history continues.

Clients of the OpenAI-compatible and AG-UI endpoints often keep no session id: they resend the
whole conversation on every request. Without a session hint, the protocol plugins ask
:class:`ConversationAffinity` which session such a request continues (docs/sessions.md,
"Conversation affinity"):

- The conversation is read as its turns: ``(role, text)`` of its system (developer), user and
  assistant messages, the text normalised (Unicode NFC, runs of white space as one space, trimmed),
  empty ones and other roles (tool results) left out, consecutive turns of one role joined.
- A *digest* names a conversation: a SHA-256 chain over its turns, so two conversations have the
  same digest only when every turn is the same.
- When a run ends ``completed``, the digest of its whole conversation (the request's messages and
  the answer) is the session's *head*, stored per (actor, agent, digest): one per session, the
  latest (a session named by a hint gets one too). A request whose earlier turns (everything
  before its last user message) have a stored head continues that session; any other history
  (never seen, an earlier message edited, a regenerated answer) starts a new session, and its
  earlier turns are given to the agent as the session's history (the cold-resume packet; the
  messages for chat-only).
- A request *claims* the head it continues, so two requests with the same history at once never
  both continue one session: the first continues it, the other starts a new session (a branch)
  with that history. A retry with the same request id (idempotency key) claims it again. The
  claim is released when the run does not complete, so the same history continues the session
  again; when it completes, the session's new head replaces it. Of two sessions that end with
  the same conversation, the one that completed last holds the head.

Everything is per actor: a digest is looked up only among the caller's own heads. The storage
keeps heads through two optional methods (``claim_conversation``, ``put_conversation``; the
built-in peewee journal has them); without them nothing is continued and every history starts a
new session that gets it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import unicodedata
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_gateway.models import Event, Run, now_ms

log = logging.getLogger("agent_gateway.affinity")

# The role a message counts as; any other role (tool, function results) is left out.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
ROOT = hashlib.sha256(b"agent-gateway conversation v1").hexdigest()
# Earlier turns given to a new session (the runtime's own bounds cut further).
SEED_MAX_TURNS = 50
# The claimer of a request without an idempotency key: its claim is dropped once the session
# moves on (a keyed claim stays, so a retry of that request is the same run).
UNKEYED_CLAIM = "claim-"
# The longest a look-up waits for the heads of ended runs to be stored.
SETTLE_SECONDS = 30.0
EVENT_PAGE = 5000
MAX_EVENT_PAGES = 2000
REPLAY_SOURCE = "adapter_replay"

Turns = list[tuple[str, str]]


def normalize(text: str) -> str:
    """A turn's text as compared: NFC, white space runs as one space, trimmed."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def conversation_turns(messages: Iterable[tuple[str, str]]) -> Turns:
    """``(role, text)`` of a conversation's messages as the turns that count (see the module)."""
    turns: Turns = []
    for role, text in messages:
        kind = ROLES.get(role)
        clean = normalize(text) if kind is not None else ""
        if not clean:
            continue
        if turns and turns[-1][0] == kind:
            turns[-1] = (kind, f"{turns[-1][1]} {clean}")
        else:
            turns.append((kind, clean))  # type: ignore[arg-type]  # kind is not None here
    return turns


def conversation_digest(turns: Sequence[tuple[str, str]]) -> str:
    """The SHA-256 chain over ``turns`` (already :func:`conversation_turns`)."""
    digest = ROOT
    for role, text in turns:
        digest = hashlib.sha256(f"{digest}\x00{role}\x00{text}".encode()).hexdigest()
    return digest


def seed_turns(turns: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
    """Earlier turns as session transcript entries (what a cold-resume packet is made of): each
    user turn with the assistant turn after it. System turns are not part of the transcript."""
    entries: list[dict[str, Any]] = []
    for role, text in turns:
        if role == "user":
            entries.append({"user": text, "assistant": ""})
        elif role == "assistant":
            if not entries or entries[-1]["assistant"]:
                entries.append({"user": "", "assistant": text})
            else:
                entries[-1]["assistant"] = text
    at = now_ms()
    return [{**entry, "status": "completed", "seeded": True, "at": at} for entry in entries[-SEED_MAX_TURNS:]]


def answer_text(events: Iterable[Event]) -> str:
    """A run's answer as the protocol endpoints give it: its final text, else its text deltas."""
    parts: list[str] = []
    final: str | None = None
    for event in events:
        if event.source == REPLAY_SOURCE:
            continue
        if event.kind == "message.delta":
            text = event.payload.get("text")
            if isinstance(text, str):
                parts.append(text)
        elif event.kind == "message.completed":
            text = event.payload.get("text")
            if isinstance(text, str):
                final = text
    return final if final is not None else "".join(parts)


@dataclass
class ConversationPlan:
    """Which session a request goes to, and what to remember once its run ends."""

    session_id: str
    # "pinned": the request named the session; "continued": a known session's head matched;
    # "new": a history never seen (given to the new session); "fresh": no earlier turns.
    affinity: str
    turns: Turns = field(default_factory=list)  # the earlier turns
    claimed: str | None = None  # the head digest this request claimed
    claimer: str | None = None
    actor_id: str = ""
    agent_id: str = ""


class ConversationAffinity:
    """The look-up and the remembering; one per gateway (``PluginRoutes.conversations``)."""

    def __init__(
        self,
        storage: Any,
        write: Callable[..., Awaitable[Any]],
        wait_run: Callable[[Run], Awaitable[Run]],
        read_events: Callable[[Run, int, int], Awaitable[list[Event]]],
    ) -> None:
        self._storage = storage
        self._write = write
        self._wait_run = wait_run
        self._read_events = read_events
        self._followers: set[asyncio.Task[None]] = set()
        # Per (actor, agent): the runs being followed, so a look-up first waits for the heads of
        # those that have ended (the client may ask its next question before the head is stored).
        self._following: dict[tuple[str, str], dict[asyncio.Task[None], Run]] = {}

    @property
    def enabled(self) -> bool:
        """Whether the storage keeps conversation heads (else nothing is ever continued)."""
        methods = ("claim_conversation", "release_conversation", "put_conversation")
        return all(hasattr(self._storage, name) for name in methods)

    async def plan(
        self,
        actor_id: str,
        agent_id: str,
        earlier: Iterable[tuple[str, str]],
        *,
        session_id: str | None = None,
        new_session_id: str | None = None,
        claimer: str | None = None,
    ) -> ConversationPlan:
        """The session of a request whose messages before its last user message are ``earlier``
        (``(role, text)``). ``session_id``: the session the request names (a hint always wins:
        nothing is looked up). ``new_session_id``: the id a new session gets (default
        ``conv-<random>``); ``claimer``: the request's idempotency key, if any (a retry with it
        continues the session its first attempt claimed)."""
        turns = conversation_turns(earlier)
        if session_id is not None:
            return ConversationPlan(session_id, "pinned", turns)
        fresh = new_session_id or "conv-" + uuid.uuid4().hex
        if all(role == "system" for role, _text in turns):  # nothing said yet: nothing to continue
            return ConversationPlan(fresh, "fresh", turns)
        digest = conversation_digest(turns)
        claimer = claimer or UNKEYED_CLAIM + uuid.uuid4().hex
        if self.enabled:
            await self._settled(actor_id, agent_id)
            claim = self._storage.claim_conversation
            found = await self._write(claim, actor_id, agent_id, digest, claimer, now_ms())
            if found is not None:
                return ConversationPlan(found, "continued", turns, digest, claimer, actor_id, agent_id)
        await self._write(self._seed, actor_id, fresh, seed_turns(turns))
        return ConversationPlan(fresh, "new", turns)

    def _seed(self, actor_id: str, session_id: str, entries: list[dict[str, Any]]) -> None:
        """A new session's record starts with the earlier turns (never over an existing one)."""
        if not entries or self._storage.get_session(actor_id, session_id) is not None:
            return
        at = now_ms()
        record = {"sessionId": session_id, "actorId": actor_id, "createdAt": at, "updatedAt": at, "turns": entries}
        self._storage.put_session(actor_id, session_id, record)

    async def release(self, plan: ConversationPlan) -> None:
        """No run was created for ``plan`` (the request was refused): its claim goes."""
        if plan.claimed is not None and self.enabled:
            await self._write(self._storage.release_conversation, plan.actor_id, plan.agent_id, plan.claimed)

    def known(self, actor_id: str, session_id: str) -> bool:
        """Whether the actor has that session (a record or a run); blocking (a worker's)."""
        storage = self._storage
        if storage.get_session(actor_id, session_id) is not None:
            return True
        return bool(storage.list_runs(actor_id=actor_id, session_id=session_id, limit=1))

    def follow(self, run: Run, plan: ConversationPlan, message: str) -> None:
        """Once ``run`` (created for ``plan``, its last user message ``message``) has ended:
        a completed run makes its whole conversation the session's head; any other end
        releases the head it claimed. Runs in the background; :meth:`close` stops it."""
        if not self.enabled:
            return
        task = asyncio.get_running_loop().create_task(self._follow(run, plan, message))
        key = (run.actor_id, run.agent_id)
        following = self._following.setdefault(key, {})
        following[task] = run
        self._followers.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._followers.discard(finished)
            following.pop(finished, None)
            if not following and self._following.get(key) is following:
                del self._following[key]

        task.add_done_callback(done)

    async def _settled(self, actor_id: str, agent_id: str) -> None:
        """Wait until the heads of the actor's ended runs with the agent are stored (a run still
        going is not waited for)."""
        ended = [task for task, run in self._following.get((actor_id, agent_id), {}).items() if run.is_terminal]
        if ended:
            await asyncio.wait(ended, timeout=SETTLE_SECONDS)

    async def _follow(self, run: Run, plan: ConversationPlan, message: str) -> None:
        try:
            ended = await self._wait_run(run)
            storage = self._storage
            if ended.status != "completed":
                if plan.claimed is not None:
                    await self._write(storage.release_conversation, run.actor_id, run.agent_id, plan.claimed)
                return
            # On a worker: the answer as the session transcript recorded it, the digest, the write
            # (a long answer's normalising and hashing stay off the event loop).
            if not await self._write(self._remember, run, plan.turns, message, None):
                # not in the session transcript (it keeps the last turns only): from the journal
                await self._write(self._remember, run, plan.turns, message, answer_text(await self._events(ended)))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("could not remember the conversation of run %s", run.host_run_id)

    def _remember(self, run: Run, earlier: Turns, message: str, answer: str | None) -> bool:
        """Store the head of ``run``'s conversation; without ``answer``, the one the session
        transcript recorded for the run (False: it has none). Blocking (a worker's)."""
        storage = self._storage
        if answer is None:
            record = storage.get_session(run.actor_id, run.session_id) or {}
            recorded = [e for e in record.get("turns") or () if e.get("hostRunId") == run.host_run_id]
            if not recorded:
                return False
            answer = str(recorded[-1].get("assistant") or "")
        turns = conversation_turns([*earlier, ("user", message), ("assistant", answer)])
        storage.put_conversation(run.actor_id, run.agent_id, conversation_digest(turns), run.session_id)
        return True

    async def _events(self, run: Run) -> list[Event]:
        events: list[Event] = []
        after = 0
        for _ in range(MAX_EVENT_PAGES):
            page = await self._read_events(run, after, EVENT_PAGE)
            events.extend(page)
            if len(page) < EVENT_PAGE:
                break
            after = page[-1].seq
        return events

    async def close(self) -> None:
        """Stop following runs (the gateway stops): their heads are not stored."""
        for task in list(self._followers):
            task.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
