"""The plugin guide stays true to the code it shows.

- A fenced block right after ``<!-- include: PATH -->`` in any doc is that file, byte for byte:
  the guide's plugin module and tests are the example plugin's real ones.
- The example plugin imports only the public API (``from agent_gateway import ...``).
- Every ``describe()`` key and field-declaration key the descriptor code reads is documented.
- The SSE frames the guide prints are what a run of the example really streams.
- The Python blocks of the plugin docs parse, and their relative links lead to files.
- Every ``agent_gateway.…`` name of docs/how-a-run-flows.md exists; docs/index.md lists every page.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

from agent_gateway.testing import GatewayClient

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = DOCS / "writing-a-runtime-plugin.md"
TESTING = DOCS / "testing-plugins.md"
EXAMPLE = ROOT / "contrib" / "example-runtime-plugin"
EXAMPLE_MODULE = EXAMPLE / "agent_gateway_example" / "__init__.py"
EXAMPLE_TESTS = EXAMPLE / "tests" / "test_example.py"

INCLUDE = re.compile(r"<!-- include: (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)^```$", re.S | re.M)
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.S | re.M)


def includes(doc: Path) -> dict[str, str]:
    text = doc.read_text(encoding="utf-8")
    found = {m["path"]: m["body"] for m in INCLUDE.finditer(text)}
    assert text.count("<!-- include:") == len(found), f"{doc.name}: an include marker without a fenced block"
    return found


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_included_code_is_the_file_itself(doc: Path) -> None:
    for path, body in includes(doc).items():
        source = ROOT / path
        assert source.is_file(), f"{doc.name} includes {path}, which does not exist"
        assert body == source.read_text(encoding="utf-8"), (
            f"{doc.name}: the block after '<!-- include: {path} -->' differs from the file; copy the file into it"
        )


def test_the_guide_shows_the_example_plugin_and_its_tests() -> None:
    shown = includes(GUIDE)
    assert EXAMPLE_MODULE.relative_to(ROOT).as_posix() in shown
    assert EXAMPLE_TESTS.relative_to(ROOT).as_posix() in shown


def test_the_example_imports_only_the_public_api() -> None:
    tree = ast.parse(EXAMPLE_MODULE.read_text(encoding="utf-8"))
    ours = [
        node
        for node in ast.walk(tree)
        if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_gateway"))
        or (isinstance(node, ast.Import) and any(a.name.startswith("agent_gateway") for a in node.names))
    ]
    assert ours, "the example imports nothing from agent_gateway"
    for node in ours:
        assert isinstance(node, ast.ImportFrom) and node.module == "agent_gateway", ast.unparse(node)
        import agent_gateway

        for alias in node.names:
            assert alias.name in agent_gateway.__all__, f"{alias.name} is not public API"
    # The tests use the testing package's public names only.
    tests = ast.parse(EXAMPLE_TESTS.read_text(encoding="utf-8"))
    modules = {n.module for n in ast.walk(tests) if isinstance(n, ast.ImportFrom)}
    assert {m for m in modules if m and m.startswith("agent_gateway")} == {"agent_gateway.testing"}


def describe_keys_read() -> tuple[set[str], set[str]]:
    """(keys of describe() the descriptor code reads, keys of a field declaration it reads)."""
    source = (ROOT / "gateway" / "descriptors.py").read_text(encoding="utf-8")
    described = set(re.findall(r'described\.get\("(\w+)"\)', source))
    declaration = set(re.findall(r'raw\.get\("(\w+)"', source))
    return described, declaration


def test_every_describe_key_is_documented() -> None:
    described, declaration = describe_keys_read()
    assert {"capabilities", "availability", "fields", "toolAccess"} <= described  # the scan still works
    assert {"key", "kind", "secret"} <= declaration
    section = GUIDE.read_text(encoding="utf-8").split("## 6. `describe()`: every key", 1)[1].split("\n## ", 1)[0]
    missing = sorted(k for k in described | declaration if f"`{k}`" not in section)
    assert not missing, f"describe() keys the gateway reads but the guide does not explain: {missing}"


@pytest.mark.parametrize("doc", [GUIDE, TESTING], ids=lambda p: p.name)
def test_python_blocks_parse_and_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    blocks = [m["body"] for m in FENCE.finditer(text) if m["lang"] == "python"]
    assert blocks
    for body in blocks:
        ast.parse(body)
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


@pytest.fixture
def agw_plugins(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the example from the checkout, as the guide shows it
    return [importlib.import_module("agent_gateway_example")]


def test_the_frames_the_guide_prints_are_what_the_example_streams(agw_client: GatewayClient) -> None:
    section = GUIDE.read_text(encoding="utf-8").split("## 4. What a client sees", 1)[1].split("\n## ", 1)[0]
    [frames] = [m["body"] for m in FENCE.finditer(section) if m["lang"] == "text"]
    printed = []
    for frame in frames.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.splitlines())
        data = json.loads(fields["data"].replace('"receipt":{...}', '"receipt":{}'))  # shortened in the guide
        printed.append((fields["id"], fields["event"], data["seq"], data["source"], data["payload"]))

    receipt = agw_client.create_run("hello", agent_id="example-upper", session_id="s-1", request_id="r-1")
    streamed = [
        (e.id, e.event, e.data["seq"], e.source, {} if e.event == "run.created" else e.payload)
        for e in agw_client.stream_to_end(receipt["hostRunId"])
    ]
    assert [(i, k, q, s, {} if k == "run.created" else p) for i, k, q, s, p in printed] == streamed


FLOW = DOCS / "how-a-run-flows.md"
DOTTED = re.compile(r"\bagent_gateway(?:\.\w+)+")


def resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ModuleNotFoundError(dotted)


def test_every_name_the_run_flow_page_gives_exists() -> None:
    names = sorted(set(DOTTED.findall(FLOW.read_text(encoding="utf-8"))))
    assert len(names) >= 30, names  # the page names the modules a run goes through
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name}: {exc}")
    assert not missing, "how-a-run-flows.md names what the code does not have:\n" + "\n".join(missing)


LINKED = [FLOW, DOCS / "index.md", DOCS / "performance.md", ROOT / "README.md"]


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for target, anchor in re.findall(r"\]\(([^)#:]*)(?:#([^)]*))?\)", text):
        path = (doc.parent / target) if target else doc
        assert path.exists(), f"{doc.name} links to {target}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.name} links to {target}#{anchor}, which has no such heading"


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    unlisted = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md" and f"]({p.name})" not in index)
    assert not unlisted, f"docs/index.md does not list {unlisted}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documentation = readme.split("## Documentation\n", 1)[1].lstrip()
    assert documentation.splitlines()[0].count("(docs/index.md)"), "the README's Documentation section starts elsewhere"
