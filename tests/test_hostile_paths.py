"""Hostile paths and arguments against the tool facade and the workspace tools.

For every case: the call is refused with a clear ToolError code, a denied receipt is stored in
real storage, and — the property that matters — nothing outside the workspace root is created or
modified (a sibling "outside" directory, /etc/passwd and /etc/shadow are snapshotted before and
after; the database folder is the gateway's own and changes). Cases that name a literal, harmless
name inside the roots may succeed, but then only inside. Then the races: a directory or a file
swapped for a symlink after the checks passed, and a file changed between read and patch.

Tree per test (see test_tools.build_tree):
    tmp/ws/notes/{today.md, a.md, sub/b.md, dir/, fifo, sock, link-* symlinks}   allowed root: notes/
    tmp/ws/private/secret.md                                                      inside, not allowed
    tmp/outside/{secret.txt, b.md}                                                outside the workspace
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import agent_gateway.plugins.workspace.tools as workspace_tools
from agent_gateway.paths import MAX_NAME_BYTES
from agent_gateway.tools import ToolCall, ToolError
from tests._tools import Harness, HarnessFactory, Recorder, h_fixture, make_harness_fixture, sha  # noqa: F401  (the fixtures `h` and `make_harness`)

OUT = "{outside}"  # placeholders filled per test
WS = "{ws}"
READ, WRITE, PATCH = "read", "write", "patch"
SAFE_MODES = (READ, WRITE, PATCH)

# (id, raw path, expected code for read/patch, expected code for write (None: may succeed inside),
#  modes to try). Paths into /etc and /dev are only ever read: we run as root here.
CASES: list[tuple[str, str, str, str | None, tuple[str, ...]]] = [
    ("dotdot", "../x", "path_refused", "path_refused", SAFE_MODES),
    ("dotdot-outside", "../outside/secret.txt", "path_refused", "path_refused", SAFE_MODES),
    ("notes-dotdot-dotdot", "notes/../../outside/secret.txt", "path_refused", "path_refused", SAFE_MODES),
    ("dot-dotdot-dotdot", "notes/./../..", "path_refused", "path_refused", SAFE_MODES),
    ("trailing-dotdot", "notes/..", "path_refused", "path_refused", SAFE_MODES),
    ("bare-dotdot", "..", "path_refused", "path_refused", SAFE_MODES),
    ("dot-slash-dotdot", "./../outside/secret.txt", "path_refused", "path_refused", SAFE_MODES),
    ("double-slash-dotdot", "notes//../..//outside/b.md", "path_refused", "path_refused", SAFE_MODES),
    ("benign-dotdot", "notes/sub/../a.md", "path_refused", "path_refused", SAFE_MODES),
    ("deep-dotdot", "notes/sub/../../../outside/b.md", "path_refused", "path_refused", SAFE_MODES),
    ("case-dotdot", "NOTES/../../outside/b.md", "path_refused", "path_refused", SAFE_MODES),
    ("backslash-dotdot", "..\\outside\\secret.txt", "path_refused", "path_refused", SAFE_MODES),
    ("backslash-notes", "notes\\..\\..\\outside\\b.md", "path_refused", "path_refused", SAFE_MODES),
    ("backslash-x", "..\\..\\x", "path_refused", "path_refused", SAFE_MODES),
    ("unc", "\\\\server\\share\\x", "path_refused", "path_refused", SAFE_MODES),
    ("mixed-slashes", "notes/..\\../outside/b.md", "path_refused", "path_refused", SAFE_MODES),
    ("abs-dotdot", WS + "/notes/../../outside/b.md", "path_refused", "path_refused", SAFE_MODES),
    ("etc-passwd", "/etc/passwd", "outside_roots", None, (READ,)),
    ("etc-passwd-double-slash", "//etc//passwd", "outside_roots", None, (READ,)),
    ("dev-null", "/dev/null", "outside_roots", None, (READ,)),
    ("abs-outside-file", OUT + "/secret.txt", "outside_roots", "outside_roots", SAFE_MODES),
    ("abs-outside-new", OUT + "/new.txt", "outside_roots", "outside_roots", SAFE_MODES),
    ("abs-private", WS + "/private/secret.md", "outside_roots", "outside_roots", SAFE_MODES),
    ("private", "private/secret.md", "outside_roots", "outside_roots", SAFE_MODES),
    ("private-new", "private/new.md", "outside_roots", "outside_roots", SAFE_MODES),
    ("ws-root-file", "top.md", "outside_roots", "outside_roots", SAFE_MODES),
    ("nul", "notes/\x00x", "path_refused", "path_refused", SAFE_MODES),
    ("nul-suffix", "notes/a.md\x00.txt", "path_refused", "path_refused", SAFE_MODES),
    ("only-nul", "\x00", "path_refused", "path_refused", SAFE_MODES),
    ("newline", "notes/a\nb.md", "path_refused", "path_refused", SAFE_MODES),
    ("escape-char", "notes/\x1b[2Ja.md", "path_refused", "path_refused", SAFE_MODES),
    ("del-char", "notes/a\x7f.md", "path_refused", "path_refused", SAFE_MODES),
    ("lone-surrogate", "notes/\ud800.md", "path_refused", "path_refused", SAFE_MODES),
    ("tilde", "~/.ssh/id_rsa", "path_refused", "path_refused", SAFE_MODES),
    ("tilde-user", "~root/.ssh/authorized_keys", "path_refused", "path_refused", SAFE_MODES),
    ("long-name", "notes/" + "n" * 300, "path_refused", "path_refused", SAFE_MODES),
    ("long-multibyte-name", "notes/" + "é" * 128, "path_refused", "path_refused", SAFE_MODES),
    ("long-path", "notes/" + "a/" * 2500, "invalid_arguments", "invalid_arguments", SAFE_MODES),
    ("long-path-bytes", "notes/" + "é/" * 1500, "path_refused", "path_refused", SAFE_MODES),
    ("very-long-path", "x" * 5000, "invalid_arguments", "invalid_arguments", SAFE_MODES),
    ("symlink-dir-out", "notes/link-out/secret.txt", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-dir-out-new", "notes/link-out/new.txt", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-dir-out-itself", "notes/link-out", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-etc", "notes/link-etc/passwd", "outside_roots", None, (READ,)),
    ("symlink-file-out", "notes/link-file-out", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-chain", "notes/chain1", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-private", "notes/link-private", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-dev-null", "notes/link-dev", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-dangling-out", "notes/dangling-out", "outside_roots", "outside_roots", SAFE_MODES),
    ("symlink-dangling-in", "notes/dangling-in", "not_found", "not_found", SAFE_MODES),
    ("symlink-loop", "notes/loop1", "path_refused", "path_refused", SAFE_MODES),
    ("symlink-root-parent", "notes/link-ws-parent/outside/b.md", "outside_roots", "outside_roots", SAFE_MODES),
    ("fifo", "notes/fifo", "special_file", "special_file", SAFE_MODES),
    ("socket", "notes/sock", "special_file", "special_file", SAFE_MODES),
    ("dir-as-file", "notes/dir", "not_a_file", "not_a_file", SAFE_MODES),
    ("root-as-file", "notes", "not_a_file", "not_a_file", SAFE_MODES),
    ("dot", ".", "outside_roots", "outside_roots", SAFE_MODES),
    ("dir-trailing-slash", "notes/dir/", "not_a_file", "not_a_file", SAFE_MODES),
    ("file-trailing-slash", "notes/a.md/", "not_a_directory", "not_a_directory", SAFE_MODES),
    ("file-as-dir", "notes/a.md/x", "not_a_directory", "not_a_directory", SAFE_MODES),
    ("new-trailing-slash", "notes/new/", "not_found", "not_a_file", SAFE_MODES),
    ("empty", "", "invalid_arguments", "invalid_arguments", SAFE_MODES),
    ("url-encoded", "%2e%2e/outside/secret.txt", "outside_roots", "outside_roots", SAFE_MODES),
    ("url-encoded-notes", "notes/%2e%2e/%2e%2e/outside/b.md", "not_found", "not_found", SAFE_MODES),
    ("url-encoded-in-notes", "notes/%2e%2e%2f%2e%2e%2foutside", "not_found", None, SAFE_MODES),
    ("fullwidth-dots", "notes/\uff0e\uff0e/\uff0e\uff0e/outside/secret.txt", "not_found", "not_found", SAFE_MODES),
    ("fullwidth-name", "notes/\uff0e\uff0e", "not_found", None, SAFE_MODES),
    ("one-dot-leaders", "notes/\u2024\u2024/x", "not_found", "not_found", SAFE_MODES),
    ("three-dots", "notes/.../x", "not_found", "not_found", SAFE_MODES),
    ("three-dots-name", "notes/...", "not_found", None, SAFE_MODES),
    ("space-dotdot", "notes/ ../x", "not_found", "not_found", SAFE_MODES),
    ("file-url", "file:///etc/passwd", "outside_roots", "outside_roots", SAFE_MODES),
    ("rtl-override", "notes/a.md\u202e", "not_found", None, SAFE_MODES),
]


def make_hostile_tree(h: Harness) -> None:
    notes = h.ws / "notes"
    (notes / "dir").mkdir()
    os.mkfifo(notes / "fifo")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    try:
        os.chdir(notes)  # a relative bind keeps the socket path short
        sock.bind("sock")
    finally:
        os.chdir(cwd)
        sock.close()
    (notes / "link-out").symlink_to(h.outside)
    (notes / "link-etc").symlink_to("/etc")
    (notes / "link-file-out").symlink_to(h.outside / "secret.txt")
    (notes / "chain1").symlink_to("chain2")
    (notes / "chain2").symlink_to("sub/chain3")
    (notes / "sub" / "chain3").symlink_to("../../../outside/secret.txt")
    (notes / "link-private").symlink_to("../private/secret.md")
    (notes / "link-dev").symlink_to("/dev/null")
    (notes / "dangling-out").symlink_to(h.outside / "created-through-link.txt")
    (notes / "dangling-in").symlink_to("missing.md")
    (notes / "loop1").symlink_to("loop2")
    (notes / "loop2").symlink_to("loop1")
    (notes / "link-ws-parent").symlink_to("../..")


def snapshot(paths: list[Path]) -> dict[str, Any]:
    """Every entry below `paths` (not following symlinks): type, mode, size, mtime, content hash."""
    seen: dict[str, Any] = {}
    for top in paths:
        if not top.exists():
            seen[str(top)] = None
            continue
        if top.is_file():
            seen[str(top)] = hashlib.sha256(top.read_bytes()).hexdigest()
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                digest = None
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as handle:
                        digest = hashlib.sha256(handle.read()).hexdigest()
                seen[path] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return seen


def outside_the_workspace(h: Harness) -> list[Path]:
    """Everything in the test's directory except the workspace itself and the gateway's own
    database folder (which receipts legitimately change), plus /etc/passwd and /etc/shadow."""
    return [p for p in h.tmp.iterdir() if p.name not in ("ws", "db")] + [Path("/etc/passwd"), Path("/etc/shadow")]


def arguments_for(mode: str, path: str) -> tuple[str, dict[str, Any]]:
    if mode == READ:
        return "workspace.read_file", {"path": path}
    if mode == WRITE:
        return "workspace.write_file", {"path": path, "text": "PWNED\n"}
    return "workspace.patch_file", {"path": path, "edits": [{"search": "secret", "replace": "PWNED"}]}


PARAMS = [
    pytest.param(raw, mode, write_code if mode == WRITE else code, id=f"{case_id}-{mode}")
    for case_id, raw, code, write_code, modes in CASES
    for mode in modes
]


@pytest.mark.parametrize(("raw", "mode", "code"), PARAMS)
async def test_hostile_path(make_harness: HarnessFactory, raw: str, mode: str, code: str | None) -> None:
    h = await make_harness()
    make_hostile_tree(h)
    raw = raw.replace(WS, str(h.ws)).replace(OUT, str(h.outside))
    before_outside = snapshot(outside_the_workspace(h))
    before_ws = snapshot([h.ws])
    tool, arguments = arguments_for(mode, raw)
    if code is None:  # a literal, harmless name: may succeed, but only inside the allowed root
        try:
            result = await h.call(tool, arguments)
        except ToolError as exc:
            assert exc.code in ("not_found", "path_refused"), exc.message
        else:
            assert result["path"].startswith("notes/")
            assert (h.ws / result["path"]).resolve().is_relative_to((h.ws / "notes").resolve())
    else:
        error = await h.refused(tool, arguments, code)
        assert len(error.message) < 400  # clear and bounded, whatever the input
        receipt = h.receipts()[-1]
        assert receipt["receiptId"] == error.receipt_id
        assert receipt["allowed"] is False and receipt["errorCode"] == code and receipt["reason"] == error.message
        assert receipt["afterVersion"] is None and receipt["diffSummary"] is None
        assert snapshot([h.ws]) == before_ws  # a refusal writes nothing anywhere
        events = await h.events()
        assert [e.kind for e in events] == ["tool.started", "tool.completed"]
        assert events[1].payload["status"] == "failed" and events[1].payload["error"]["code"] == code
    assert snapshot(outside_the_workspace(h)) == before_outside
    assert not (h.outside / "created-through-link.txt").exists()


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40 and len(PARAMS) >= 150
    assert any(len(raw.split("/")[-1].encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for _, raw, *_ in CASES)


async def test_a_valid_write_with_hostile_content_stays_inside(h: Harness) -> None:
    """The content is never interpreted as a path."""
    result = await h.call("workspace.write_file", {"path": "notes/ok.md", "text": "../../outside/secret.txt\x00"})
    assert result["path"] == "notes/ok.md"
    assert (h.ws / "notes" / "ok.md").read_bytes() == b"../../outside/secret.txt\x00"
    assert (h.outside / "secret.txt").read_text() == "outside secret\n"


# -- races: the tree changes after the checks passed ------------------------------------------------


def swap_dir_for_symlink(directory: Path, target: Path) -> None:
    shutil.rmtree(directory)
    directory.symlink_to(target)


def swap_file_for_symlink(file: Path, target: Path) -> None:
    file.unlink()
    file.symlink_to(target)


class SwapInVeto(Recorder):
    """A veto hook that, after every check passed, swaps part of the tree for a symlink out."""

    def __init__(self, swap: Callable[[], None]) -> None:
        super().__init__(self._swap)
        self.swap = swap
        self.swapped = False

    def _swap(self, call: ToolCall) -> None:
        self.swap()
        self.swapped = True
        return None


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("workspace.write_file", {"path": "notes/sub/b.md", "text": "PWNED\n", "expectedHash": sha(b"inside b\n")}),
        ("workspace.write_file", {"path": "notes/sub/new.md", "text": "PWNED\n"}),
        ("workspace.patch_file", {"path": "notes/sub/b.md", "edits": [{"search": "b", "replace": "PWNED"}]}),
        ("workspace.read_file", {"path": "notes/sub/b.md"}),
    ],
    ids=["overwrite", "create", "patch", "read"],
)
async def test_directory_swapped_for_a_symlink_after_the_check(
    make_harness: HarnessFactory, tool: str, arguments: dict[str, Any]
) -> None:
    holder: dict[str, Harness] = {}
    veto = SwapInVeto(lambda: swap_dir_for_symlink(holder["h"].ws / "notes" / "sub", holder["h"].outside))
    h = holder["h"] = await make_harness(extra_plugins=(veto,))
    before_outside = snapshot(outside_the_workspace(h))
    error = await h.refused(tool, arguments, "path_changed")
    assert veto.swapped
    assert "changed" in error.message and "sub" in error.message
    assert snapshot(outside_the_workspace(h)) == before_outside
    assert (h.outside / "b.md").read_text() == "outside b\n"
    assert not (h.outside / "new.md").exists()
    receipt = h.receipts()[-1]
    assert receipt["allowed"] is False and receipt["errorCode"] == "path_changed"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("workspace.patch_file", {"path": "notes/a.md", "edits": [{"search": "alpha", "replace": "PWNED"}]}),
        ("workspace.read_file", {"path": "notes/a.md"}),
    ],
    ids=["patch", "read"],
)
async def test_file_swapped_for_a_symlink_after_the_check(
    make_harness: HarnessFactory, tool: str, arguments: dict[str, Any]
) -> None:
    holder: dict[str, Harness] = {}
    veto = SwapInVeto(lambda: swap_file_for_symlink(holder["h"].ws / "notes" / "a.md", holder["h"].outside / "b.md"))
    h = holder["h"] = await make_harness(extra_plugins=(veto,))
    before_outside = snapshot(outside_the_workspace(h))
    await h.refused(tool, arguments, "path_changed")
    assert snapshot(outside_the_workspace(h)) == before_outside


@pytest.mark.parametrize("swap", ["file", "dir"])
async def test_swap_between_the_handlers_read_and_its_write(
    h: Harness, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """The last moment before the write: the final name or its directory becomes a symlink out.
    The write refuses (or, had the swap come after its own check, rename would replace the
    symlink itself); the outside is never written."""
    real_write = workspace_tools.write_file_atomically

    def swapping_write(resolved: Any, data: bytes, **kwargs: Any) -> Any:
        if swap == "file":
            swap_file_for_symlink(h.ws / "notes" / "sub" / "b.md", h.outside / "b.md")
        else:
            swap_dir_for_symlink(h.ws / "notes" / "sub", h.outside)
        return real_write(resolved, data, **kwargs)

    monkeypatch.setattr(workspace_tools, "write_file_atomically", swapping_write)
    before_outside = snapshot(outside_the_workspace(h))
    await h.refused(
        "workspace.patch_file",
        {"path": "notes/sub/b.md", "edits": [{"search": "inside", "replace": "PWNED"}]},
        "path_changed",
    )
    assert snapshot(outside_the_workspace(h)) == before_outside
    assert (h.outside / "b.md").read_text() == "outside b\n"


async def test_rename_replaces_a_symlink_instead_of_following_it(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the final name becomes a symlink after write_file_atomically's own lstat, the rename
    replaces the link: the new bytes land inside, the link's target is untouched."""
    import agent_gateway.paths as paths

    real_rename = os.rename
    target = h.ws / "notes" / "sub" / "b.md"

    def late_swap(src: Any, dst: Any, **kwargs: Any) -> None:
        swap_file_for_symlink(target, h.outside / "b.md")
        real_rename(src, dst, **kwargs)

    monkeypatch.setattr(paths.os, "rename", late_swap)
    await h.call("workspace.patch_file", {"path": "notes/sub/b.md", "edits": [{"search": "inside", "replace": "NEW"}]})
    assert not target.is_symlink() and target.read_text() == "NEW b\n"
    assert (h.outside / "b.md").read_text() == "outside b\n"


async def test_file_changed_between_read_and_patch(h: Harness) -> None:
    target = h.ws / "notes" / "a.md"
    read = await h.call("workspace.read_file", {"path": "notes/a.md"})
    target.write_text("the other writer's content\n")
    error = await h.refused(
        "workspace.patch_file",
        {
            "path": "notes/a.md",
            "expectedHash": read["version"]["sha256"],
            "edits": [{"search": "other", "replace": "X"}],
        },
        "stale_version",
    )
    assert "read it again" in error.message
    assert target.read_text() == "the other writer's content\n"
    receipt = h.receipts()[-1]
    assert receipt["beforeVersion"]["sha256"] == sha(b"the other writer's content\n")


async def test_file_changed_between_the_version_check_and_the_write(make_harness: HarnessFactory) -> None:
    """Another writer slips in after the facade's version check (here: during the veto hook)."""
    holder: dict[str, Harness] = {}

    def other_writer() -> None:
        (holder["h"].ws / "notes" / "a.md").write_text("alpha from the other writer\n")

    h = holder["h"] = await make_harness(extra_plugins=(SwapInVeto(other_writer),))
    read_hash = sha((h.ws / "notes" / "a.md").read_bytes())
    error = await h.refused(
        "workspace.patch_file",
        {"path": "notes/a.md", "expectedHash": read_hash, "edits": [{"search": "alpha", "replace": "A"}]},
        "stale_version",
    )
    assert "changed during the call" in error.message
    assert (h.ws / "notes" / "a.md").read_text() == "alpha from the other writer\n"


async def test_file_changed_inside_the_write_window(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrowest window: between the handler's read and write_file_atomically's re-check."""
    real_write = workspace_tools.write_file_atomically

    def racing_write(resolved: Any, data: bytes, **kwargs: Any) -> Any:
        (h.ws / "notes" / "a.md").write_text("raced\n")
        return real_write(resolved, data, **kwargs)

    monkeypatch.setattr(workspace_tools, "write_file_atomically", racing_write)
    await h.refused(
        "workspace.patch_file", {"path": "notes/a.md", "edits": [{"search": "alpha", "replace": "A"}]}, "stale_version"
    )
    assert (h.ws / "notes" / "a.md").read_text() == "raced\n"


async def test_a_file_created_by_someone_else_is_not_clobbered(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = workspace_tools.write_file_atomically

    def racing_write(resolved: Any, data: bytes, **kwargs: Any) -> Any:
        (h.ws / "notes" / "fresh.md").write_text("theirs\n")
        return real_write(resolved, data, **kwargs)

    monkeypatch.setattr(workspace_tools, "write_file_atomically", racing_write)
    await h.refused("workspace.write_file", {"path": "notes/fresh.md", "text": "mine\n"}, "stale_version")
    assert (h.ws / "notes" / "fresh.md").read_text() == "theirs\n"


async def test_hostile_arguments_beyond_paths(h: Harness) -> None:
    """Odd argument shapes are refused by the validator with a receipt; nothing is written."""
    before = snapshot([h.ws, *outside_the_workspace(h)])
    for arguments in (
        None,
        [],
        {"path": {"$ref": "/etc/passwd"}, "text": "x"},
        {"path": "notes/x.md", "text": "x", "__proto__": {}},
        {"path": "notes/x.md", "text": "x", "expectedHash": "../" * 30},
        {"path": "notes/x.md", "text": "x" * (1_048_576 + 1)},
    ):
        with pytest.raises(ToolError) as info:
            await h.call("workspace.write_file", arguments)
        assert info.value.code == "invalid_arguments"
    with contextlib.suppress(ToolError):
        await h.call("workspace.patch_file", {"path": "notes/a.md", "unifiedDiff": "--- a/../../etc/passwd\n+++ b/x\n"})
    assert snapshot([h.ws, *outside_the_workspace(h)]) == before
    assert all(r["allowed"] is False for r in h.receipts())
    assert len(h.receipts()) == 7
