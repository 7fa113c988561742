"""What users and agents write survives the session routes as written, on both storage backends:
the Markdown export fences every message body (a user's ``# Heading``, HTML or a fence of its own
stays inside its message) and escapes everything else; search snippets escape text that looks
like a tag instead of dropping it, and no stored character (U+E000/U+E001, the engines' hit
markers; U+0001, PostgreSQL's stand-in for ``<``) can become highlight markup."""

from __future__ import annotations

import html
import random
import re
import unicodedata
from typing import Any

from markdown_it import MarkdownIt

from tests._harness import run_to_end
from tests._sessions import ALICE, auth, body, gateway, get_json

TAGGED = "ECHO-LAST<<SLOW 0.35 18>>"
PRIVATE = "private \ue000use\ue001 area ctrl\x01char"
MARK = re.compile(r"</?mark>")


def plain(snippet: str) -> str:
    """A snippet's text as a browser shows it."""
    return html.unescape(MARK.sub("", snippet))


def marked(snippet: str) -> list[str]:
    return re.findall(r"<mark>(.*?)</mark>", snippet)


async def search(client: Any, query: str) -> dict[str, str]:
    found = await get_json(client, "/v1/sessions", q=query)
    return {s["sessionId"]: s["snippet"] for s in found["sessions"]}


async def test_snippets_escape_tags_and_never_turn_stored_text_into_marks(make_gateway: Any, storage_kind: str) -> None:
    client, _plugin = await gateway(make_gateway, storage_kind)
    await run_to_end(client, body("s-tag", TAGGED, "t1"), headers=auth(ALICE))
    await run_to_end(client, body("s-pua", PRIVATE, "p1"), headers=auth(ALICE))

    snippet = (await search(client, "echo"))["s-tag"]
    assert TAGGED in plain(snippet)  # nothing that looks like a tag is dropped
    assert "ECHO-LAST&lt;&lt;SLOW 0.35 18&gt;&gt;" in MARK.sub("", snippet)  # escaped, not passed through
    assert marked(snippet) and {m.casefold() for m in marked(snippet)} == {"echo"}
    assert MARK.sub("", snippet).count("<") == 0  # <mark> is the only markup
    # The words inside the tag-like text are searchable too (PostgreSQL's parser skipped them).
    snippet = (await search(client, "slow"))["s-tag"]
    assert TAGGED in plain(snippet) and {m.casefold() for m in marked(snippet)} == {"slow"}

    snippet = (await search(client, "private"))["s-pua"]
    assert {m.casefold() for m in marked(snippet)} == {"private"}  # not the stored "\ue000use\ue001"
    assert "\ue000use\ue001" in plain(snippet) and "ctrl\x01char" in plain(snippet)
    assert "<" not in MARK.sub("", snippet)
    snippet = (await search(client, "area"))["s-pua"]
    assert {m.casefold() for m in marked(snippet)} == {"area"}
    assert "\ue000use\ue001" in plain(snippet)


def fences(markdown: str) -> list[str]:
    return [token.content for token in MarkdownIt("commonmark").parse(markdown) if token.type == "fence"]


def headings(markdown: str) -> list[tuple[str, str]]:
    """(tag, text as shown) of each heading; the text must be plain (no markup, no link)."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    found = []
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            children = tokens[i + 1].children or []
            assert all(child.type == "text" for child in children), children
            found.append((token.tag, "".join(child.content for child in children)))
    return found


async def test_markdown_export_keeps_each_body_inside_its_message(make_gateway: Any, storage_kind: str) -> None:
    client, _plugin = await gateway(make_gateway, storage_kind)
    question = "# Heading\n<b>bold</b> and <script>alert(1)</script>\n````\n``` a fence of my own\n" + TAGGED
    await run_to_end(client, body("s-md", question, "m1"), headers=auth(ALICE))
    await run_to_end(client, body("s-md", "second *turn*", "m2"), headers=auth(ALICE))

    response = await client.get("/v1/sessions/s-md/export", params={"format": "markdown"}, headers=auth(ALICE))
    assert response.status == 200 and response.content_type == "text/markdown"
    markdown = await response.text()
    # The export's structure alone: the title (the first line, shown as written), one heading per run.
    assert headings(markdown) == [
        ("h1", "# Heading"),
        ("h2", "Run 1 — completed, new_session"),
        ("h2", "Run 2 — completed, native_live"),
    ]
    # Every body comes back whole and exactly, in order: question, thoughts, answer of each run.
    assert fences(markdown) == [
        question + "\n",
        "secret pondering\n",
        f"Here is about {question}\n",
        "second *turn*\n",
        "secret pondering\n",
        "Here is about second *turn*\n",
    ]
    tokens = MarkdownIt("commonmark").parse(markdown)
    rendered = MarkdownIt("commonmark").render(markdown)
    assert "<b>" not in rendered and "<script>" not in rendered and "&lt;b&gt;bold&lt;/b&gt;" in rendered
    assert "<em>turn</em>" not in rendered
    # The only HTML the export writes itself is the folding of thoughts.
    raw = {t.content.strip() for t in tokens if t.type == "html_block"}
    assert raw == {"<details><summary>Thoughts</summary>", "</details>"}

    # A custom title with HTML and Markdown in it is text on the heading's line.
    response = await client.patch(
        "/v1/sessions/s-md", json={"title": "<b>*Bold*</b> [x](javascript:alert(1))\n# two"}, headers=auth(ALICE)
    )
    assert response.status == 200
    response = await client.get("/v1/sessions/s-md/export", params={"format": "markdown"}, headers=auth(ALICE))
    found = headings(await response.text())
    assert [tag for tag, _ in found] == ["h1", "h2", "h2"]
    assert found[0][1] == "<b>*Bold*</b> [x](javascript:alert(1)) # two"


def _snippet_by_every_word(text: str, terms: list[str], words: int = 16) -> list[tuple[str, bool]]:
    """What a snippet is, from every word of the text (the gateway's reads only what it shows)."""
    word = re.compile(r"\w+")

    def folded(text: str) -> str:  # no case, no diacritics (as SQLite's unicode61 tokenizer matches)
        return "".join(c for c in unicodedata.normalize("NFD", text) if not unicodedata.combining(c)).casefold()

    prefixes = tuple(folded(term) for term in terms)
    spans = [m.span() for m in word.finditer(text)]
    hits = {i for i, (a, b) in enumerate(spans) if folded(text[a:b]).startswith(prefixes)}
    if not spans:
        return [(text[:200], False)] if text.strip() else []
    first = min(hits, default=0)
    start = max(0, min(first - words // 4, len(spans) - words))
    end = min(len(spans), start + words)
    pieces: list[tuple[str, bool]] = [("…", False)] if start > 0 else []
    at = spans[start][0]
    for i in range(start, end):
        a, b = spans[i]
        if i in hits:
            if a > at:
                pieces.append((text[at:a], False))
            pieces.append((text[a:b], True))
            at = b
    if spans[end - 1][1] > at:
        pieces.append((text[at : spans[end - 1][1]], False))
    if end < len(spans):
        pieces.append(("…", False))
    return pieces


def test_a_snippet_is_the_same_whatever_the_number_of_hits() -> None:
    """Built from the first hit on (its time does not grow with the hits, as SQLite's snippet()
    does with their square), a snippet is what the words of the whole text make: hits anywhere,
    many or none, near either end, punctuation and other scripts between the words."""
    from agent_gateway.plugins.journal_peewee.sessions import snippet_pieces

    rng = random.Random(9)
    vocabulary = ["kelp", "Kelpie", "tide", "TIDAL", "reef", "gull", "a", "über", "Öl", "海藻", "x1", "_"]
    vocabulary += ["café", "CAFÉ", "Cafe", "résumé", "naïve", "Ångström", "öl"]
    for _case in range(400):
        count = rng.choice((0, 1, 3, 15, 16, 17, 40, 300))
        parts = [rng.choice(vocabulary) + rng.choice(("", " ", " ", ", ", " … ", "\n", "!? ")) for _ in range(count)]
        text = rng.choice(("", " ", "— ")) + "".join(parts)
        terms = rng.sample(
            ["kel", "tid", "gull", "öl", "ol", "海", "zzz", "a", "cafe", "café", "resu", "angs"], rng.randrange(1, 3)
        )
        assert snippet_pieces(text, terms) == _snippet_by_every_word(text, terms), (text, terms)
    many = "kelp " * 25_000  # every word a hit
    assert snippet_pieces(many, ["kelp"]) == _snippet_by_every_word(many, ["kelp"])


def test_a_snippet_built_by_the_gateway_shows_the_words_around_the_first_hit() -> None:
    from agent_gateway.plugins.journal_peewee.sessions import snippet_pieces

    text = " ".join(f"w{i}" for i in range(100)) + " \ue000Target\ue001 <b> " + " ".join(f"x{i}" for i in range(100))
    pieces = snippet_pieces(text, ["targ"])
    assert pieces[0] == ("…", False) and pieces[-1] == ("…", False)
    assert [t for t, hit in pieces if hit] == ["Target"]
    shown = "".join(t for t, _ in pieces)
    assert "w99 \ue000Target\ue001 <b> x0" in shown and len(shown.split()) <= 18
    assert snippet_pieces("no hit here", ["zzz"]) == [("no hit here", False)]
    assert snippet_pieces("", ["a"]) == []


async def test_a_hit_without_its_diacritics_is_marked_in_the_snippet(make_gateway: Any) -> None:
    """SQLite's search ignores Latin diacritics both ways; its snippets mark those hits too (a
    snippet that found no hit would show the text's start, unmarked)."""
    client, _plugin = await gateway(make_gateway, "sqlite")
    opening = " ".join(f"w{i}" for i in range(40))
    await run_to_end(client, body("s-cafe", f"{opening} the CAFÉ résumé", "c1"), headers=auth(ALICE))
    await run_to_end(client, body("s-plain", f"{opening} a cafe resume", "c2"), headers=auth(ALICE))

    for query, expected in (
        ("cafe", {"s-cafe": ["CAFÉ"], "s-plain": ["cafe"]}),
        ("résu", {"s-cafe": ["résumé"], "s-plain": ["resume"]}),
    ):
        found = await search(client, query)
        assert {session: marked(snippet) for session, snippet in found.items()} == expected, query
        assert all(plain(snippet).startswith("…") for snippet in found.values())  # around the hit
