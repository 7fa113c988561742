"""A session's Markdown export (``GET /v1/sessions/{id}/export?format=markdown``): text escaped as
CommonMark reads it, code and fenced blocks that hold any text."""

from __future__ import annotations

import html
import re
from typing import Any

_MD_PUNCTUATION = frozenset("\\`*_[]#|~!")
_BACKTICKS = re.compile(r"`+")


def md_text(value: Any) -> str:
    """Text as inline Markdown that reads as written: one line, HTML escaped (a ``<b>`` shows as
    ``<b>``), Markdown punctuation backslash-escaped."""
    out = []
    for char in " ".join(str(value).split()):
        if char in "<>&":
            out.append(html.escape(char))
        elif char in _MD_PUNCTUATION:
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def md_code(value: Any) -> str:
    """A code span holding ``value`` verbatim (on one line): its backtick run is longer than any
    inside, padded when the text starts or ends with a backtick or a space."""
    text = " ".join(str(value).splitlines())
    if not text:
        return "` `"
    ticks = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " ") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def md_fenced(body: str) -> list[str]:
    """A message body as a fenced block, so nothing in it (a ``# Heading``, HTML, a fence of its
    own) escapes its message: the fence is longer than any backtick run in the body, and what a
    fence holds is shown as written (HTML in it is text, never markup)."""
    ticks = "`" * max(3, max((len(m) for m in _BACKTICKS.findall(body)), default=0) + 1)
    return [f"{ticks}text", body, ticks]


def to_markdown(detail: dict[str, Any]) -> str:
    """A session export as Markdown: each run's question, answer, folded thoughts, tools,
    citations and changed files. Bodies are fenced and everything else escaped, so the export's
    structure is the gateway's alone whatever the user or the agent wrote."""
    session = detail["session"]
    binding = detail["binding"]
    lines = [
        f"# {md_text(session['title'] or session['sessionId'])}",
        "",
        f"- Session: {md_code(session['sessionId'])}",
        f"- Agent: {md_code(session['agentId'])}"
        + (f" (agent session {md_code(binding['agentSessionId'])})" if binding["agentSessionId"] else ""),
        f"- Runs: {session['runCount']}",
        "",
    ]
    for number, item in enumerate(detail["runs"], 1):
        receipt, transcript = item["receipt"], item["transcript"]
        mode = f", {md_text(transcript['sessionMode'])}" if transcript["sessionMode"] else ""
        lines += [f"## Run {number} — {md_text(receipt['status'])}{mode}", "", md_code(receipt["hostRunId"]), ""]
        if transcript["question"]:
            lines += ["**User**", "", *md_fenced(transcript["question"]), ""]
        if transcript["thoughts"]["text"]:
            thoughts = md_fenced(transcript["thoughts"]["text"])
            lines += ["<details><summary>Thoughts</summary>", "", *thoughts, "", "</details>", ""]
        for card in transcript["tools"]:
            name = card.get("title") or card.get("tool") or card.get("kind") or "tool"
            receipt_id = f" (receipt {md_code(card['receiptId'])})" if card.get("receiptId") else ""
            lines.append(
                f"- Tool {md_code(card['toolCallId'])}: {md_text(name)} — {md_text(card.get('status'))}{receipt_id}"
            )
        for permission in transcript["permissions"]:
            outcome = permission.get("outcome") or permission.get("status")
            option = f" {md_text(permission['optionId'])}" if permission.get("optionId") else ""
            lines.append(
                f"- Permission {md_code(permission.get('requestId'))}: {md_text(permission.get('title') or '')} — "
                f"{md_text(outcome)}{option}"
            )
        if transcript["tools"] or transcript["permissions"]:
            lines.append("")
        if transcript["answer"]["text"]:
            lines += ["**Assistant**", "", *md_fenced(transcript["answer"]["text"]), ""]
        if transcript["citations"]:
            lines += ["Sources:", ""]
            lines += [f"- {_citation(c)}" for c in transcript["citations"]]
            lines.append("")
        if transcript["files"]:
            lines += ["Files changed:", ""] + [f"- {md_code(f['path'])}" for f in transcript["files"]] + [""]
        if transcript["terminal"] and transcript["terminal"].get("reason") and receipt["status"] != "completed":
            lines += [f"_{md_text(transcript['terminal']['reason'])}_", ""]
    return "\n".join(lines)


def _citation(citation: dict[str, Any]) -> str:
    """A citation's own Markdown (a link, as the tool wrote it) on one line with HTML escaped;
    a bare URL as code."""
    markdown = citation.get("markdown")
    if isinstance(markdown, str) and markdown.strip():
        return html.escape(" ".join(markdown.split()), quote=False)
    return md_code(citation.get("url") or "")
