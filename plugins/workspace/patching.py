"""Applying edits to text: exact search/replace blocks and unified diffs. Pure functions."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """The edit does not apply; the message says which edit or hunk and why."""


def _find_once(text: str, search: str) -> tuple[int, int]:
    """(first index, number of matches capped at 2), counting overlapping matches."""
    first = text.find(search)
    if first < 0:
        return -1, 0
    return first, 2 if text.find(search, first + 1) >= 0 else 1


def apply_edits(text: str, edits: Sequence[dict[str, Any]]) -> str:
    """Apply ``[{search, replace}, …]`` in order; each search must match exactly once in the text
    as it is after the previous edits. A file with CRLF line ends also accepts LF-only blocks."""
    for number, edit in enumerate(edits, 1):
        search, replace = edit["search"], edit["replace"]
        if search == "":
            raise PatchError(f"edit {number}: the search text is empty")
        first, count = _find_once(text, search)
        if count == 0 and "\r\n" in text and "\r\n" not in search and "\n" in search:
            search, replace = search.replace("\n", "\r\n"), replace.replace("\r\n", "\n").replace("\n", "\r\n")
            first, count = _find_once(text, search)
        if count == 0:
            raise PatchError(
                f"edit {number}: the search text was not found (it must match the file exactly, "
                "whitespace and line ends included)"
            )
        if count > 1:
            raise PatchError(
                f"edit {number}: the search text matches more than once; include more surrounding text "
                "so it matches exactly once"
            )
        text = text[:first] + replace + text[first + len(search) :]
    return text


@dataclass
class Hunk:
    number: int
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    old_no_newline: bool = False
    new_no_newline: bool = False


def parse_unified_diff(diff: str) -> list[Hunk]:
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    hunks: list[Hunk] = []
    current: Hunk | None = None
    last_op = ""
    headers = 0
    i = 0
    while i < len(lines):
        line = lines[i].removesuffix("\r")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            headers += 1
            if headers > 1:
                raise PatchError("the diff touches more than one file; send one file per call")
            current = None
            i += 2
            continue
        match = _HUNK.match(line)
        if match:
            current = Hunk(len(hunks) + 1, int(match.group(1)))
            hunks.append(current)
            last_op = ""
        elif current is None:
            pass  # "diff --git", "index …" and other preamble lines
        elif line.startswith("\\"):
            if last_op in ("-", " "):
                current.old_no_newline = True
            if last_op in ("+", " "):
                current.new_no_newline = True
        else:
            op, body = (line[0], line[1:]) if line else (" ", "")
            if op not in " +-":
                raise PatchError(f"hunk {current.number}: line {line[:40]!r} starts with neither ' ', '+' nor '-'")
            if op in " -":
                current.old.append(body)
            if op in " +":
                current.new.append(body)
            last_op = op
        i += 1
    return hunks


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a unified diff (one file). Each hunk's context and removed lines must appear in the
    file; when they are not at the line the header names, the nearest exact match is used."""
    hunks = parse_unified_diff(diff)
    if not hunks:
        raise PatchError("no hunks found: a unified diff needs '@@ -a,b +c,d @@' headers")
    newline = "\r\n" if "\r\n" in text else "\n"
    ends_with_newline = text.endswith("\n") or text == ""
    body = text[:-1] if ends_with_newline else text
    lines = [] if text == "" else [line.removesuffix("\r") for line in body.split("\n")]
    out: list[str] = []
    cursor = 0
    for hunk in hunks:
        size = len(hunk.old)
        hint = hunk.old_start if size == 0 else max(hunk.old_start - 1, 0)
        if size == 0:
            position = min(max(hint, cursor), len(lines))
        else:
            candidates = [p for p in range(cursor, len(lines) - size + 1) if lines[p : p + size] == hunk.old]
            if not candidates:
                raise PatchError(
                    f"hunk {hunk.number} (@@ -{hunk.old_start} …): its context and removed lines were not found "
                    f"in the file{' after the previous hunk' if cursor else ''}"
                )
            position = min(candidates, key=lambda p: abs(p - hint))
        out.extend(lines[cursor:position])
        out.extend(hunk.new)
        cursor = position + size
        if cursor >= len(lines):
            if hunk.new_no_newline:
                ends_with_newline = False
            elif hunk.old_no_newline:
                ends_with_newline = True
    out.extend(lines[cursor:])
    if not out:
        return ""
    return newline.join(out) + (newline if ends_with_newline else "")
