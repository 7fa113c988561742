"""The session index of the peewee journal: one row per (actor, session) for listing, one digest
per ended run, and full-text search with the database's own engine.

- ``{prefix}session_index``: what a session list shows (agent, profile/model, title, pinned,
  counts, last mode and status, created/updated) plus the searchable text (the user's
  questions, the assistant's finals, tool names, cited and changed files). Listed by keyset
  on (pinned, updated_at, session_id).
- ``{prefix}run_digests``: per ended run, what its transcript contributes; a session's
  searchable text and counts follow its digests (the newest added to them, anything else
  recomputed from all of them), so indexing a run twice is harmless.
- Search: SQLite FTS5 (``{prefix}session_fts``, rowid = the index row's id; ``bm25`` rank,
  snippets built here); PostgreSQL a ``tsvector`` column with a GIN index (``ts_rank_cd``,
  ``ts_headline``), text configuration ``simple`` (no stemming: works the same for any language).

A snippet is a list of ``(text, hit)`` pieces, so no stored character can pass for a hit marker.
On SQLite every snippet is built by :func:`snippet_pieces` from the stored texts (FTS5's
``snippet()`` takes time in the square of a row's hits). PostgreSQL's ``ts_headline`` marks hits
with U+E000 … U+E001; a row whose text holds one of those (or U+0001, which stands in for ``<`` so
``ts_headline`` keeps text that looks like a tag) gets its snippet from :func:`snippet_pieces`
instead. The API layer escapes the pieces.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from agent_gateway import Run

HIT_START, HIT_END = "\ue000", "\ue001"
ACTIVE_STATUSES = ("pending", "queued", "running", "awaiting_permission")
# Searchable text kept per column (characters): bounded so a huge session stays indexable.
MAX_SEARCH_TEXT = 100_000
_DIGEST_TEXTS = frozenset(("question", "answer", "tools", "files"))
TITLE_LENGTH = 80
_WORD = re.compile(r"\w+", re.UNICODE)
# PostgreSQL's parser reads "<...>" as a tag: ts_headline drops it and to_tsvector skips its words.
# What it indexes and highlights has "<" as U+0001 (a blank to the parser), put back afterwards.
PG_LT = "\x01"
# Words a snippet shows (as many as FTS5's snippet() showed).
SNIPPET_WORDS = 16
# Characters before a snippet's first hit read back for the words shown before it.
SNIPPET_LOOKBACK = 4096
Snippet = list[tuple[str, bool]]

_INDEX_COLUMNS = (
    "id",
    "actor_id",
    "session_id",
    "workspace_id",
    "agent_id",
    "profile",
    "model",
    "title",
    "title_custom",
    "pinned",
    "run_count",
    "message_count",
    "tool_count",
    "last_mode",
    "last_status",
    "last_run_id",
    "created_at",
    "updated_at",
)


def default_title(message: Any) -> str:
    """The first line of the first user message, cut to TITLE_LENGTH characters."""
    if not isinstance(message, str):
        return ""
    line = next((part.strip() for part in message.splitlines() if part.strip()), "")
    return line if len(line) <= TITLE_LENGTH else line[: TITLE_LENGTH - 1] + "…"


def query_terms(query: str) -> list[str]:
    """The words of a search query (anything else is dropped: no query syntax reaches the engine)."""
    return _WORD.findall(query)[:16]


def marked_pieces(marked: str, restore: dict[str, str] | None = None) -> Snippet:
    """An engine's snippet (hits between HIT_START and HIT_END, the text free of both) as pieces;
    ``restore`` maps stand-in characters back."""
    pieces: Snippet = []
    hit = False
    for part in re.split(f"([{HIT_START}{HIT_END}])", marked):
        if part in (HIT_START, HIT_END):
            hit = part == HIT_START
        elif part:
            for old, new in (restore or {}).items():
                part = part.replace(old, new)
            pieces.append((part, hit))
    return pieces


def _without_marks(text: str) -> str:
    """`text` with its combining marks taken off (é → e)."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c))


def _latin_variants() -> dict[str, str]:
    """Each ASCII letter's forms with diacritics (Latin-1, Latin Extended-A/B and Additional)."""
    variants: dict[str, set[str]] = {}
    for code in itertools.chain(range(0xC0, 0x250), range(0x1E00, 0x1F00)):
        char = chr(code)
        base = _without_marks(char).lower()
        if len(base) == 1 and base.isascii() and base.isalpha() and char.lower() != base:
            variants.setdefault(base, set()).add(char.lower())
    return {base: "".join(sorted(forms)) for base, forms in variants.items()}


_LATIN_VARIANTS = _latin_variants()


def _term_pattern(term: str) -> str:
    """A regular expression for `term` that ignores Latin diacritics both ways, as FTS5's
    ``unicode61`` tokenizer matches (``cafe`` finds ``café`` and ``café`` finds ``cafe``)."""
    pattern = []
    for char in term:
        base = _without_marks(char).lower()
        forms = _LATIN_VARIANTS.get(base)
        pattern.append(f"[{base}{forms}]" if forms else re.escape(char))
    return "".join(pattern)


def snippet_pieces(text: str, terms: Sequence[str], words: int = SNIPPET_WORDS) -> Snippet:
    """A snippet of ``text`` built here: ``words`` words around the first word a term starts
    (ignoring case and Latin diacritics, as SQLite's search does), those words hits (a window
    near the end shows more words before it). Its work is a scan up to the first hit and the
    words shown, however many hits the text holds: SQLite's ``snippet()`` grows with the square
    of them (one 100,000-character answer took it 0.9 s for a one-letter query)."""
    if not terms:
        return [(text[:200], False)] if text.strip() else []
    starts = re.compile(r"(?<!\w)(?:" + "|".join(_term_pattern(term) for term in terms) + ")", re.IGNORECASE)
    found = starts.search(text)
    at = found.start() if found else 0
    back = max(0, at - SNIPPET_LOOKBACK)
    before = [m.span() for m in _WORD.finditer(text, back, at)]
    if before and before[0][0] == back > 0 and _WORD.match(text, back - 1):
        before.pop(0)  # a word the look-back cut
    after: list[tuple[int, int]] = []
    for match in _WORD.finditer(text, at):
        after.append(match.span())
        if len(after) == words:
            break
    if not after and not before:
        return [(text[:200], False)] if text.strip() else []
    # A quarter of the window before the hit, more when the text ends within it (none without a hit).
    lead = min(len(before), max(words // 4 if found else 0, words - len(after)))
    shown = before[len(before) - lead :] + after[: words - lead]
    pieces: Snippet = [("…", False)] if _WORD.search(text, 0, shown[0][0]) else []
    position = shown[0][0]
    for a, b in shown:
        if starts.match(text, a):
            if a > position:
                pieces.append((text[position:a], False))
            pieces.append((text[a:b], True))
            position = b
    stop = shown[-1][1]
    if stop > position:
        pieces.append((text[position:stop], False))
    if _WORD.search(text, stop):
        pieces.append(("…", False))
    return pieces


class SessionIndexMixin:
    """Session index methods of :class:`PeeweeStorage` (mixed in; uses its database)."""

    database: Any
    is_sqlite: bool
    table_prefix: str
    models: Any

    def _qualified(self, table: str) -> str:  # provided by PeeweeStorage
        raise NotImplementedError

    def _write(self) -> Any:  # provided by PeeweeStorage
        raise NotImplementedError

    # -- tables ---------------------------------------------------------------------------------
    @property
    def _si(self) -> str:
        return self._qualified(f"{self.table_prefix}session_index")

    @property
    def _rd(self) -> str:
        return self._qualified(f"{self.table_prefix}run_digests")

    @property
    def _fts(self) -> str:
        return self._qualified(f"{self.table_prefix}session_fts")

    def _sql(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if not self.is_sqlite:
            sql = sql.replace("?", "%s")
        return self.database.execute_sql(sql, list(params))

    # -- writes ---------------------------------------------------------------------------------
    def touch_session_index(self, run: Run) -> None:
        """Create or update the session's index row from one of its runs (status, agent, mode).
        An older run than the one last seen changes nothing but the run count; a run no longer
        stored (its session was deleted after this snapshot of it) changes nothing."""
        options = run.request.get("options")
        if not isinstance(options, dict):
            options = {}
        profile, model = options.get("profile"), options.get("model")
        runs = self._qualified(self.models.run._meta.table_name)
        newer = "excluded.updated_at >= cur.updated_at"
        with self._write():
            if not self._run_stored(run.host_run_id):
                return
            self._sql(
                f"INSERT INTO {self._si} AS cur (actor_id, session_id, workspace_id, agent_id, profile, model, title,"
                " last_status, last_run_id, last_mode, created_at, updated_at, run_count)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"
                " ON CONFLICT (actor_id, session_id) DO UPDATE SET"
                f" agent_id = CASE WHEN {newer} THEN excluded.agent_id ELSE cur.agent_id END,"
                f" workspace_id = CASE WHEN {newer} THEN excluded.workspace_id ELSE cur.workspace_id END,"
                f" profile = CASE WHEN {newer} THEN excluded.profile ELSE cur.profile END,"
                f" model = CASE WHEN {newer} THEN excluded.model ELSE cur.model END,"
                f" last_status = CASE WHEN {newer} THEN excluded.last_status ELSE cur.last_status END,"
                f" last_run_id = CASE WHEN {newer} THEN excluded.last_run_id ELSE cur.last_run_id END,"
                f" last_mode = CASE WHEN {newer} THEN COALESCE(excluded.last_mode, cur.last_mode)"
                " ELSE cur.last_mode END,"
                f" updated_at = CASE WHEN {newer} THEN excluded.updated_at ELSE cur.updated_at END,"
                " created_at = CASE WHEN excluded.created_at < cur.created_at THEN excluded.created_at"
                " ELSE cur.created_at END,"
                f" run_count = (SELECT COUNT(*) FROM {runs} r WHERE r.actor_id = cur.actor_id"
                " AND r.session_id = cur.session_id)",
                (
                    run.actor_id,
                    run.session_id,
                    run.workspace_id,
                    run.agent_id,
                    profile if isinstance(profile, str) else None,
                    model if isinstance(model, str) else None,
                    default_title(run.request.get("message")),
                    run.status,
                    run.host_run_id,
                    run.session_mode,
                    run.created_at,
                    run.updated_at,
                ),
            )

    def put_run_digest(self, digest: dict[str, Any]) -> None:
        """Store what an ended run contributes to its session (replacing an earlier digest of the
        same run), then bring the session's counts and searchable text up to date: the digest is
        added to them when it is new and the session's newest (the common case), else they are
        recomputed from every digest. Nothing for a run no longer stored (its session was deleted
        meanwhile)."""
        columns = (
            "host_run_id",
            "actor_id",
            "session_id",
            "created_at",
            "status",
            "question",
            "answer",
            "tools",
            "files",
            "message_count",
            "tool_count",
            "mode",
            "agent_session_id",
        )
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns[1:])
        # The texts only feed the session's search text, cut at MAX_SEARCH_TEXT after joining:
        # a run's text past that can never reach it, and a long run's whole answer (1.6 MB for
        # 100,000 deltas) stored and read back made its end cost 10-20 ms of worker time.
        values = [
            digest[c][:MAX_SEARCH_TEXT] if c in _DIGEST_TEXTS and isinstance(digest[c], str) else digest[c]
            for c in columns
        ]
        actor_id, session_id = digest["actor_id"], digest["session_id"]
        with self._write():
            self._hold_session_text(actor_id, session_id)
            if not self._run_stored(digest["host_run_id"]):
                return
            latest = self._sql(
                f"SELECT created_at, host_run_id FROM {self._rd} WHERE actor_id = ? AND session_id = ?"
                " ORDER BY created_at DESC, host_run_id DESC LIMIT 1",
                (actor_id, session_id),
            ).fetchone()
            self._sql(
                f"INSERT INTO {self._rd} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
                f" ON CONFLICT (host_run_id) DO UPDATE SET {updates}",
                values,
            )
            # Past every digest of the session (so not one replacing its own): appended.
            if latest is None or tuple(latest) < (digest["created_at"], digest["host_run_id"]):
                self._append_to_session(dict(zip(columns, values, strict=True)))
            else:
                self._recompute_session(actor_id, session_id)

    def _hold_session_text(self, actor_id: str, session_id: str) -> None:
        """In a write transaction that reads a session's digests or index row to rewrite its
        text: wait for any other such transaction of the session to end first. Cluster instances
        share PostgreSQL, where a transaction does not see another's uncommitted digest (READ
        COMMITTED): two runs of one session ending at once each wrote the row back without the
        other's text. A transaction-scoped advisory lock on the session (its statements after it
        see what the other committed); SQLite's write transactions take turns already."""
        if not self.is_sqlite:
            self._sql(
                "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))",
                (f"{self._si}\x1f{actor_id}\x1f{session_id}",),  # (no NUL: psycopg2 refuses it)
            )

    def _run_stored(self, host_run_id: str) -> bool:
        runs = self._qualified(self.models.run._meta.table_name)
        return self._sql(f"SELECT 1 FROM {runs} WHERE host_run_id = ?", (host_run_id,)).fetchone() is not None

    def _recompute_session(self, actor_id: str, session_id: str) -> None:
        rows = self._sql(
            f"SELECT question, answer, tools, files, message_count, tool_count, mode FROM {self._rd}"
            " WHERE actor_id = ? AND session_id = ? ORDER BY created_at, host_run_id",
            (actor_id, session_id),
        ).fetchall()
        texts: dict[str, list[str]] = {"questions": [], "answers": [], "tools": [], "files": []}
        messages = tools = 0
        last_mode = None
        for question, answer, tool_names, files, message_count, tool_count, mode in rows:
            for column, value in (
                ("questions", question),
                ("answers", answer),
                ("tools", tool_names),
                ("files", files),
            ):
                if value:
                    texts[column].append(value)
            messages += message_count
            tools += tool_count
            last_mode = mode or last_mode
        joined = {column: "\n".join(parts)[:MAX_SEARCH_TEXT] for column, parts in texts.items()}
        self._sql(
            f"UPDATE {self._si} SET questions = ?, answers = ?, tools = ?, files = ?, message_count = ?,"
            " tool_count = ?, last_mode = COALESCE(?, last_mode) WHERE actor_id = ? AND session_id = ?",
            (
                joined["questions"],
                joined["answers"],
                joined["tools"],
                joined["files"],
                messages,
                tools,
                last_mode,
                actor_id,
                session_id,
            ),
        )
        self._reindex_search(actor_id, session_id)

    def _append_to_session(self, digest: dict[str, Any]) -> None:
        """What `_recompute_session` makes of the session's digests when `digest` is the newest of
        them, from the index row alone: a session's end of turn reads and writes its row, not
        every earlier turn's texts (at 1,000 turns of 2,000 characters that took 20 ms of CPU a
        turn, `bench/bench_session_turns.py`)."""
        actor_id, session_id = digest["actor_id"], digest["session_id"]
        row = self._sql(
            f"SELECT id, title, questions, answers, tools, files, message_count, tool_count FROM {self._si}"
            " WHERE actor_id = ? AND session_id = ?",
            (actor_id, session_id),
        ).fetchone()
        if row is None:
            return  # no index row to update (as the recompute's UPDATE would find none)
        row_id, title, *texts = row[:6]
        message_count, tool_count = row[6:]
        joined = [
            (old + "\n" + value if old else value)[:MAX_SEARCH_TEXT] if value else old
            for old, value in zip(texts, (digest[c] for c in ("question", "answer", "tools", "files")), strict=True)
        ]
        mode = digest["mode"] or self._last_digest_mode(actor_id, session_id)
        counts = (message_count + digest["message_count"], tool_count + digest["tool_count"], mode)
        if joined == texts and any(texts):
            # Every text is at its cut (or the run added none) and was indexed with it: the search
            # text stands; only the counts change.
            self._sql(
                f"UPDATE {self._si} SET message_count = ?, tool_count = ?, last_mode = COALESCE(?, last_mode)"
                " WHERE id = ?",
                (*counts, row_id),
            )
            return
        self._sql(
            f"UPDATE {self._si} SET questions = ?, answers = ?, tools = ?, files = ?, message_count = ?,"
            " tool_count = ?, last_mode = COALESCE(?, last_mode) WHERE id = ?",
            (*joined, *counts, row_id),
        )
        self._reindex_search(actor_id, session_id, (row_id, title, *joined))

    def _last_digest_mode(self, actor_id: str, session_id: str) -> str | None:
        """The mode of the session's newest digest that has one (what the recompute keeps)."""
        found = self._sql(
            f"SELECT mode FROM {self._rd} WHERE actor_id = ? AND session_id = ? AND mode IS NOT NULL AND mode <> ''"
            " ORDER BY created_at DESC, host_run_id DESC LIMIT 1",
            (actor_id, session_id),
        ).fetchone()
        return found[0] if found else None

    def _reindex_search(self, actor_id: str, session_id: str, row: Sequence[Any] | None = None) -> None:
        if not self.is_sqlite:
            self._sql(
                f"UPDATE {self._si} SET search_doc ="
                " setweight(to_tsvector('simple', replace(title, '<', ?)), 'A')"
                " || setweight(to_tsvector('simple', replace(questions, '<', ?)), 'A')"
                " || setweight(to_tsvector('simple', replace(answers, '<', ?)), 'B')"
                " || setweight(to_tsvector('simple', replace(tools, '<', ?)), 'C')"
                " || setweight(to_tsvector('simple', replace(files, '<', ?)), 'C')"
                " WHERE actor_id = ? AND session_id = ?",
                (*[PG_LT] * 5, actor_id, session_id),
            )
            return
        if row is None:  # (the caller may have the row's id, title and texts at hand)
            row = self._sql(
                f"SELECT id, title, questions, answers, tools, files FROM {self._si}"
                " WHERE actor_id = ? AND session_id = ?",
                (actor_id, session_id),
            ).fetchone()
        if row is None:
            return
        self._sql(f"DELETE FROM {self._fts} WHERE rowid = ?", (row[0],))
        self._sql(
            f"INSERT INTO {self._fts} (rowid, title, questions, answers, tools, files) VALUES (?, ?, ?, ?, ?, ?)", row
        )

    def update_session_index(
        self, actor_id: str, session_id: str, *, title: str | None = None, pinned: bool | None = None
    ) -> bool:
        """Set a session's title (a custom one; "" goes back to the default) and/or pinned flag.
        False when the session has no index row."""
        with self._write():
            if (
                self._sql(
                    f"SELECT 1 FROM {self._si} WHERE actor_id = ? AND session_id = ?", (actor_id, session_id)
                ).fetchone()
                is None
            ):
                return False
            if pinned is not None:
                self._sql(
                    f"UPDATE {self._si} SET pinned = ? WHERE actor_id = ? AND session_id = ?",
                    (1 if pinned else 0, actor_id, session_id),
                )
            if title is not None:
                custom = bool(title.strip())
                if not custom:
                    title = default_title(self._first_question(actor_id, session_id))
                self._sql(
                    f"UPDATE {self._si} SET title = ?, title_custom = ? WHERE actor_id = ? AND session_id = ?",
                    (title, 1 if custom else 0, actor_id, session_id),
                )
                self._reindex_search(actor_id, session_id)
        return True

    def _first_question(self, actor_id: str, session_id: str) -> str | None:
        model = self.models.run
        row = (
            model.select(model.request)
            .where((model.actor_id == actor_id) & (model.session_id == session_id))
            .order_by(model.created_at, model.host_run_id)
            .tuples()
            .first()
        )
        if row is None:
            return None
        message = json.loads(row[0] or "{}").get("message")
        return message if isinstance(message, str) else None

    def delete_session_history(self, actor_id: str, session_id: str) -> bool:
        """Remove the gateway's history of one session: its runs, events, receipts, session record,
        digests, conversation heads and index/search rows. False when there was nothing to remove."""
        runs = self._qualified(self.models.run._meta.table_name)
        events = self._qualified(self.models.event._meta.table_name)
        receipts = self._qualified(self.models.receipt._meta.table_name)
        records = self._qualified(self.models.session._meta.table_name)
        key = (actor_id, session_id)
        owned = f"(SELECT host_run_id FROM {runs} WHERE actor_id = ? AND session_id = ?)"
        with self._write():
            found = self._sql(f"SELECT id FROM {self._si} WHERE actor_id = ? AND session_id = ?", key).fetchone()
            run_count = self._sql(f"SELECT COUNT(*) FROM {runs} WHERE actor_id = ? AND session_id = ?", key).fetchone()
            if found is None and not run_count[0]:
                return False
            self._sql(f"DELETE FROM {events} WHERE host_run_id IN {owned}", key)
            self._sql(f"DELETE FROM {receipts} WHERE host_run_id IN {owned}", key)
            self._sql(f"DELETE FROM {self._rd} WHERE actor_id = ? AND session_id = ?", key)
            self._sql(f"DELETE FROM {runs} WHERE actor_id = ? AND session_id = ?", key)
            self._sql(f"DELETE FROM {records} WHERE actor_id = ? AND session_id = ?", key)
            heads = self._qualified(f"{self.table_prefix}conversation_heads")  # conversations.py
            self._sql(f"DELETE FROM {heads} WHERE actor_id = ? AND session_id = ?", key)
            if found is not None:
                if self.is_sqlite:
                    self._sql(f"DELETE FROM {self._fts} WHERE rowid = ?", (found[0],))
                self._sql(f"DELETE FROM {self._si} WHERE id = ?", (found[0],))
        return True

    # -- reads ------------------------------------------------------------------------------------
    @staticmethod
    def _index_row(row: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(_INDEX_COLUMNS, row, strict=False))

    def get_session_index(self, actor_id: str, session_id: str) -> dict[str, Any] | None:
        row = self._sql(
            f"SELECT {', '.join(_INDEX_COLUMNS)} FROM {self._si} WHERE actor_id = ? AND session_id = ?",
            (actor_id, session_id),
        ).fetchone()
        return self._index_row(row) if row else None

    def list_session_index(
        self,
        actor_id: str,
        *,
        agent_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 50,
        after: tuple[int, int, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Index rows, pinned first, then most recently updated (keyset: ``after`` is the
        (pinned, updated_at, session_id) of the last row of the previous page)."""
        where, params = self._filters(actor_id, agent_id, statuses, "")
        if after is not None:
            pinned, updated_at, session_id = after
            where += " AND (pinned < ? OR (pinned = ? AND (updated_at < ? OR (updated_at = ? AND session_id < ?))))"
            params += [pinned, pinned, updated_at, updated_at, session_id]
        rows = self._sql(
            f"SELECT {', '.join(_INDEX_COLUMNS)} FROM {self._si} WHERE {where}"
            " ORDER BY pinned DESC, updated_at DESC, session_id DESC LIMIT ?",
            [*params, limit],
        ).fetchall()
        return [self._index_row(row) for row in rows]

    def _filters(
        self, actor_id: str, agent_id: str | None, statuses: Sequence[str] | None, alias: str
    ) -> tuple[str, list[Any]]:
        where, params = f"{alias}actor_id = ?", [actor_id]
        if agent_id is not None:
            where += f" AND {alias}agent_id = ?"
            params.append(agent_id)
        if statuses is not None:
            where += f" AND {alias}last_status IN ({', '.join('?' * len(statuses))})"
            params.extend(statuses)
        return where, params

    def search_session_index(
        self,
        actor_id: str,
        query: str,
        *,
        agent_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Sessions matching every word of ``query`` (prefixes match), best first, each with a
        ``snippet``: ``(text, hit)`` pieces."""
        terms = query_terms(query)
        if not terms:
            return []
        columns = ", ".join(f"si.{c}" for c in _INDEX_COLUMNS)
        where, params = self._filters(actor_id, agent_id, statuses, "si.")
        n = len(_INDEX_COLUMNS)
        if self.is_sqlite:
            match = " ".join('"' + term.replace('"', '""') + '"*' for term in terms)
            # Snippets are built here from the texts (`snippet_pieces`), not by FTS5's snippet(),
            # whose time grows with the square of a row's hits.
            rows = self._sql(
                f"SELECT {columns}, si.title, si.questions, si.answers, si.tools, si.files,"
                f" bm25({self._fts}, 6.0, 4.0, 2.0, 1.0, 1.0) AS score"
                f" FROM {self._fts} JOIN {self._si} si ON si.id = {self._fts}.rowid"
                f" WHERE {self._fts} MATCH ? AND {where} ORDER BY score, si.session_id LIMIT ? OFFSET ?",
                [match, *params, limit, offset],
            ).fetchall()
            found = []
            for row in rows:
                item = self._index_row(row)
                item["snippet"] = snippet_pieces(" … ".join(part for part in row[n : n + 5] if part), terms)
                item["score"] = float(row[n + 5])
                found.append(item)
            return found
        tsquery = " & ".join(f"{term}:*" for term in terms)
        options = f"StartSel={HIT_START}, StopSel={HIT_END}, MaxFragments=2, MaxWords=24, MinWords=6"
        rows = self._sql(
            f"SELECT {', '.join(f'h.{c}' for c in _INDEX_COLUMNS)},"
            " CASE WHEN h.reserved THEN NULL ELSE ts_headline('simple', replace(h.doc, '<', ?), h.q, ?) END,"
            " h.score, h.reserved FROM (SELECT hit.*,"
            " strpos(hit.doc, ?) > 0 OR strpos(hit.doc, ?) > 0 OR strpos(hit.doc, ?) > 0 AS reserved"
            f" FROM (SELECT {columns}, concat_ws(' … ', si.title, si.questions, si.answers, si.tools, si.files)"
            " AS doc, q, ts_rank_cd(si.search_doc, q) AS score"
            f" FROM {self._si} si, to_tsquery('simple', ?) q WHERE si.search_doc @@ q AND {where}"
            " ORDER BY score DESC, si.session_id LIMIT ? OFFSET ?) hit) h ORDER BY h.score DESC, h.session_id",
            [PG_LT, options, HIT_START, HIT_END, PG_LT, tsquery, *params, limit, offset],
        ).fetchall()
        found = []
        for row in rows:
            item = self._index_row(row)
            if row[n + 2]:
                item["snippet"] = snippet_pieces(self._search_text(item["id"]), terms)
            else:
                item["snippet"] = marked_pieces(row[n] or "", {PG_LT: "<"})
            item["score"] = float(row[n + 1])
            found.append(item)
        return found

    def _search_text(self, index_id: int) -> str:
        row = self._sql(
            f"SELECT title, questions, answers, tools, files FROM {self._si} WHERE id = ?", (index_id,)
        ).fetchone()
        return " … ".join(part for part in row or () if part)

    def runs_without_digest(self, limit: int = 1000) -> list[Run]:
        """Ended runs whose digest is missing (e.g. marked interrupted at start-up)."""
        model = self.models.run
        runs = self._qualified(model._meta.table_name)
        rows = self._sql(
            f"SELECT r.host_run_id FROM {runs} r LEFT JOIN {self._rd} d ON d.host_run_id = r.host_run_id"
            " WHERE d.host_run_id IS NULL AND r.status IN ('completed', 'failed', 'cancelled', 'interrupted')"
            " LIMIT ?",
            (limit,),
        ).fetchall()
        found = []
        for (host_run_id,) in rows:
            run = self.get_run(host_run_id)  # type: ignore[attr-defined]
            if run is not None:
                found.append(run)
        return found
