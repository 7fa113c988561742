"""Mapping between LightRAG's document names and workspace paths, citations and locators.

LightRAG keeps only the *basename* of a document's ``file_source`` (``notes/widget.md`` is stored
as ``widget.md``; a second ``other/widget.md`` is then refused as a duplicate). The gateway
therefore names every document it inserts with one path segment that encodes the workspace and
the workspace-relative path, percent-encoded so it has no ``/``:

    encode_source("local:test", "notes/widget.md") == "local%3Atest%2Fnotes%2Fwidget.md"

and maps a reference's ``file_path`` back with :func:`decode_source`. Documents inserted by other
means (no encoded workspace) stay unmapped: they are cited by their bare name, without a link.

The answer text the provider's model wrote is rewritten the same way (:func:`rewrite_answer`): its
reference list keeps only entries naming the caller's documents (shown as workspace paths), and a
name of another workspace's document is never shown.

Citations never carry a ``file://`` URL, the provider's URL or its storage paths: the
``citationUrl`` comes from the ``[lightrag] citation_url`` template over the *workspace* path. A
line locator is given only when the retrieved text was found, as it is, in the workspace file;
otherwise the citation is document-level and says so (``locatorDegraded: true``).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

REFERENCE_SCHEMA = "gateway.knowledge_rag.reference.v1"
SEP = "<SEP>"  # LightRAG joins the sources of merged entities with this
_BAD_COMPONENT = re.compile(r"[\x00-\x1f\x7f\\]")
# A query LightRAG takes: at least three characters once white space is stripped (it strips with
# Python's str.strip; the class below is white space to neither Python nor ECMA-262).
QUERY_PATTERN = r"[^\s\u001c-\u001f\u0085\ufeff][\s\S]+[^\s\u001c-\u001f\u0085\ufeff]"
_URLS = re.compile(r"(?:file|https?)://[^\s)\]>'\"]+", re.IGNORECASE)
_ABS_PATHS = re.compile(r"(?<![\w.])/(?:[\w.@+-]+/)+[\w.@+-]*")
# The answer's reference list, as LightRAG's prompt asks for it ("### References" then
# "- [1] <file name>" lines); bold or colon variants of the heading too.
_REFERENCES_HEADING = re.compile(r"^\s*(?:#{1,6}\s*)?(?:\*\*|__)?\s*references?\s*:?\s*(?:\*\*|__)?\s*:?\s*$", re.I)
_REFERENCE_ENTRY = re.compile(r"^(\s*(?:[-*+•]\s*)?\[\s*(?:\d{1,4}|[A-Z]{2})\s*\]\s*)(\S.*?)\s*$")
_FILE_LIKE = re.compile(r"^\S+\.[A-Za-z0-9]{1,8}$|%2[Ff]")
_ENCODED_NAME = re.compile(r"[A-Za-z0-9._~%+-]*%2[Ff][A-Za-z0-9._~%+-]*")
OTHER_WORKSPACE_LABEL = "a document of another workspace"


def normalise_relative(path: str) -> str | None:
    """A clean workspace-relative path (``a/b.md``), or None when ``path`` is not one."""
    if not isinstance(path, str) or not path or _BAD_COMPONENT.search(path):
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or path.startswith(("/", "~")):
        return None
    return "/".join(parts)


def encode_source(workspace_id: str, relative: str) -> str:
    return quote(f"{workspace_id}/{relative}", safe="")


def decode_source(file_path: str) -> tuple[str, str] | None:
    """``(workspace_id, relative_path)`` for a name made by :func:`encode_source`, else None."""
    if not isinstance(file_path, str) or "%2f" not in file_path.lower() or "/" in file_path:
        return None
    decoded = unquote(file_path)
    workspace_id, _, relative = decoded.partition("/")
    clean = normalise_relative(relative)
    if not workspace_id or clean is None:
        return None
    return workspace_id, clean


def split_sources(file_path: Any) -> list[str]:
    if not isinstance(file_path, str):
        return []
    return [p.strip() for p in file_path.split(SEP) if p.strip()]


def display_name(file_path: str) -> str:
    """What an unmapped provider name may show: its last path segment, never a directory."""
    name = file_path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    name = _URLS.sub("", name)
    return name[:200] or "document"


def in_source_paths(source_path: str, wanted: list[str]) -> bool:
    """Whether ``source_path`` is one of ``wanted`` or lies below one of them (a directory)."""
    for raw in wanted:
        clean = normalise_relative(raw)
        if clean is None:
            continue
        if source_path == clean or source_path.startswith(clean + "/"):
            return True
    return False


def scrub(text: str, secrets: list[str]) -> str:
    """Remove URLs, absolute paths and the given strings (the provider URL, its folders) from a
    provider message before anyone sees it."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<provider>")
    text = _URLS.sub("<url>", text)
    return _ABS_PATHS.sub("<path>", text)


def reference_id(workspace_id: str, source_path: str | None, file_path: str) -> str:
    key = f"{workspace_id}\0{source_path or ''}\0{file_path}"
    return "kref_" + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Locator:
    """Where in a document a citation points. ``kind`` is ``lines`` (precise) or ``document``."""

    kind: str
    start_line: int | None = None
    end_line: int | None = None
    reason: str | None = None

    @property
    def degraded(self) -> bool:
        return self.kind != "lines"

    def to_wire(self) -> dict[str, Any]:
        if self.kind == "lines":
            return {"kind": "lines", "startLine": self.start_line, "endLine": self.end_line}
        return {"kind": "document"}


def locate(text: str, excerpt: str) -> Locator | None:
    """The lines of ``text`` holding ``excerpt`` exactly (surrounding whitespace ignored), or None.
    Never guesses: a chunk that is not found as it is gives None."""
    needle = excerpt.strip()
    if len(needle) < 8:
        return None
    index = text.find(needle)
    if index < 0:
        return None
    start = text.count("\n", 0, index) + 1
    end = start + needle.count("\n")
    return Locator("lines", start, end)


def citation_url(template: str, workspace_id: str, source_path: str, locator: Locator) -> str:
    fragment = f"#L{locator.start_line}-L{locator.end_line}" if locator.kind == "lines" else ""
    return (
        template.replace("{workspace}", quote(workspace_id, safe=""))
        .replace("{path}", quote(source_path, safe="/"))
        .replace("{fragment}", fragment)
    )


def _md_label(text: str) -> str:
    return re.sub(r"([\[\]\\])", r"\\\1", text)


def citation(
    template: str, workspace_id: str, source_path: str | None, file_path: str, locator: Locator
) -> dict[str, Any]:
    """The citation fields of a reference: ``citationMarkdown``, ``citationUrl``,
    ``locatorDegraded``, ``locator`` and, when degraded, ``degradedReason``."""
    if source_path is None:
        name = display_name(file_path)
        out: dict[str, Any] = {
            "citationMarkdown": f"`{name}` (knowledge base; not a workspace file)",
            "citationUrl": None,
            "locatorDegraded": True,
            "locator": {"kind": "document"},
            "degradedReason": "the document was not added through the gateway, so it has no workspace path",
        }
        return out
    url = citation_url(template, workspace_id, source_path, locator)
    label = _md_label(source_path)
    if locator.kind == "lines":
        span = (
            f"line {locator.start_line}"
            if locator.start_line == locator.end_line
            else (f"lines {locator.start_line}–{locator.end_line}")
        )
        label = f"{label} · {span}"
    out = {
        "citationMarkdown": f"[{label}](<{url}>)" if " " in url else f"[{label}]({url})",
        "citationUrl": url,
        "locatorDegraded": locator.degraded,
        "locator": locator.to_wire(),
    }
    if locator.degraded:
        out["degradedReason"] = locator.reason or "the retrieved text could not be found in the workspace file"
    return out


def _basename(name: str) -> str:
    return name.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _entry_name(raw: str) -> str:
    """The file name a reference-list entry gives, without Markdown around it."""
    name = raw.strip()
    link = re.match(r"^\[([^\]]+)\]\([^)]*\)$", name)
    if link:
        name = link.group(1)
    return name.strip("`*_\"' ")


def rewrite_answer(
    answer: str,
    workspace_id: str,
    names: Mapping[str, str],
    foreign: Iterable[str],
    secrets: Iterable[str] = (),
) -> str:
    """The provider's answer text in the caller's terms.

    ``names`` maps the provider names of the caller's retrieved documents to what to show (their
    workspace path); ``foreign`` are provider names of other workspaces' documents. In the
    answer's reference list (a ``References`` heading, then ``- [n] name`` entries; ``[n] name``
    entries naming a file elsewhere too) an entry naming one of the caller's documents — by
    provider name, workspace path, or a basename no other document shares — is rewritten to the
    workspace path; every other entry (another workspace's file, or a name that is not one of the
    caller's documents) is dropped, and a heading left with no entry goes too. Elsewhere in the
    text the caller's provider names become workspace paths and another workspace's encoded names
    become a neutral label. ``secrets`` (the provider's URLs, its key) and ``file://`` are removed.
    """
    shown_by_key: dict[str, str] = {}
    for provider, shown in names.items():
        for key in (provider, unquote(provider), shown):
            shown_by_key[key.casefold()] = shown
    foreign_bases = set()
    for provider in foreign:
        decoded = decode_source(provider)
        foreign_bases.add(_basename(decoded[1] if decoded else unquote(provider)).casefold())
    own_bases = Counter(_basename(shown).casefold() for shown in set(names.values()))
    for shown in set(names.values()):
        base = _basename(shown).casefold()
        if own_bases[base] == 1 and base not in foreign_bases:
            shown_by_key.setdefault(base, shown)

    out: list[str] = []
    heading: int | None = None  # index in `out` of the open reference section's heading
    kept = 0

    def close_section() -> None:
        if heading is not None and kept == 0:
            del out[heading:]
            while out and not out[-1].strip():
                out.pop()

    for line in answer.split("\n"):
        if _REFERENCES_HEADING.match(line):
            close_section()
            heading, kept = len(out), 0
            out.append(line)
            continue
        entry = _REFERENCE_ENTRY.match(line)
        name = _entry_name(entry.group(2)) if entry else ""
        if entry and (heading is not None or _FILE_LIKE.search(name)):
            known = shown_by_key.get(name.casefold())
            if known is not None:
                out.append(entry.group(1) + known)
                kept += 1
            continue  # not one of the caller's documents: the entry goes
        if heading is not None and line.strip():
            close_section()
            heading = None
        out.append(line)
    close_section()
    text = "\n".join(out)

    for provider, shown in sorted(names.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(provider, shown)

    def neutral(match: re.Match[str]) -> str:
        decoded = decode_source(match.group(0))
        if decoded is None or decoded[0] == workspace_id:
            return match.group(0)
        return OTHER_WORKSPACE_LABEL

    text = _ENCODED_NAME.sub(neutral, text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "")
    return text.replace("file://", "")
