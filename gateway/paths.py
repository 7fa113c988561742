"""Safe path resolution and file I/O for the tool facade.

Every path an agent names goes through :func:`resolve_path` before anything touches the disk:

- refused outright: an empty path, NUL or other control characters, backslashes, a path longer
  than 4096 bytes or a name longer than 255 bytes, any ``..`` component, ``~`` (never expanded);
- an absolute path is accepted only when it lies inside an allowed root (it is then made relative);
- symlinks are resolved (``os.path.realpath``) and the *resolved* location must lie inside one of
  the run's allowed roots, which are themselves relative to the workspace root and must not
  escape it;
- only regular files count as files: devices, FIFOs and sockets are refused, and so is a
  directory where a file is expected.

The check alone would leave a window: a directory could be swapped for a symlink between the check
and the I/O. :func:`read_file_safely` and :func:`write_file_atomically` therefore never follow a
symlink: they open the workspace root, walk the resolved path one directory at a time with
``O_NOFOLLOW | O_DIRECTORY`` relative to the previous directory's fd, and open the final name with
``O_NOFOLLOW``. A write goes to a temp file created in that parent directory fd and is renamed over
the target (``rename`` replaces a symlink, never follows it), keeping the original file's mode.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255

Expect = Literal["file", "dir", "any"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PathError(Exception):
    """A path was refused. ``code`` is one of: ``path_refused`` (malformed or forbidden
    spelling), ``outside_roots``, ``no_workspace``, ``not_found``, ``not_a_file``,
    ``not_a_directory``, ``special_file``, ``path_changed`` (the path changed under us between
    the check and the I/O), ``stale_version``, ``too_large``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FileVersion:
    sha256: str
    mtime_ns: int
    size: int

    def to_wire(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "mtimeNs": self.mtime_ns, "size": self.size}


@dataclass(frozen=True)
class ResolvedPath:
    """A checked path. ``absolute`` is the resolved location (no symlinks); ``relative`` is the
    same location relative to the workspace root, with ``/`` separators (``"."`` for the root
    itself); ``root`` is the allowed root that contains it, as the run spelled it normalised
    (``"notes/"``; ``""`` for the whole workspace). ``workspace_root`` is the resolved workspace
    directory the safe I/O helpers start from."""

    absolute: Path
    relative: str
    root: str
    workspace_root: Path
    exists: bool = True

    @property
    def parts(self) -> tuple[str, ...]:
        return () if self.relative == "." else tuple(self.relative.split("/"))


@dataclass(frozen=True)
class AllowedRoot:
    label: str  # "notes/" or "" (the whole workspace)
    absolute: Path | None  # resolved directory; None when refused
    problem: str | None = None


def _clip(raw: str, limit: int = 80) -> str:
    text = raw if len(raw) <= limit else raw[:limit] + "…"
    return repr(text)


def _check_spelling(raw: Any, what: str = "path") -> None:
    if not isinstance(raw, str):
        raise PathError("path_refused", f"{what} must be a string")
    if raw == "":
        raise PathError("path_refused", f"{what} is empty")
    if "\x00" in raw:
        raise PathError("path_refused", f"{what} contains a NUL byte")
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise PathError("path_refused", f"{what} contains a control character")
    try:
        encoded = raw.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PathError("path_refused", f"{what} is not valid Unicode (lone surrogate)") from exc
    if len(encoded) > MAX_PATH_BYTES:
        raise PathError("path_refused", f"{what} is {len(encoded)} bytes long; the limit is {MAX_PATH_BYTES}")
    if "\\" in raw:
        raise PathError("path_refused", f"{what} {_clip(raw)} contains a backslash; use '/' as the separator")
    if raw.startswith("~"):
        raise PathError("path_refused", f"{what} {_clip(raw)} starts with '~'; home directories are never expanded")
    for name in raw.split("/"):
        if name == "..":
            raise PathError("path_refused", f"{what} {_clip(raw)} contains '..'; parent-directory steps are refused")
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise PathError("path_refused", f"{what} has a name longer than {MAX_NAME_BYTES} bytes")


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _components(raw: str) -> list[str]:
    return [p for p in raw.split("/") if p not in ("", ".")]


def allowed_roots_of(workspace_root: Path, allowed_roots: list[str]) -> list[AllowedRoot]:
    """Normalise and resolve a run's allowed roots. A root that is malformed, escapes the
    workspace (directly or through a symlink) or is not a directory is kept with its ``problem``
    so it can be described, and never matches a path."""
    ws_real = os.path.realpath(workspace_root)
    roots: list[AllowedRoot] = []
    seen: set[str] = set()
    for raw in allowed_roots:
        try:
            if raw in ("", "."):
                parts: list[str] = []
            else:
                _check_spelling(raw, "allowed root")
                if raw.startswith("/"):
                    real = os.path.realpath(raw)
                    if not _inside(real, ws_real):
                        raise PathError("outside_roots", f"allowed root {_clip(raw)} is outside the workspace")
                    rel = os.path.relpath(real, ws_real)
                    parts = [] if rel == "." else rel.split(os.sep)
                else:
                    parts = _components(raw)
            label = "/".join(parts) + "/" if parts else ""
            if label in seen:
                continue
            seen.add(label)
            real = os.path.realpath(os.path.join(ws_real, *parts))
            if not _inside(real, ws_real):
                raise PathError("outside_roots", f"allowed root {_clip(raw)} resolves outside the workspace")
            if not os.path.isdir(real):
                roots.append(AllowedRoot(label, None, "is not an existing directory"))
                continue
            roots.append(AllowedRoot(label, Path(real)))
        except PathError as exc:
            roots.append(AllowedRoot(raw if isinstance(raw, str) else repr(raw), None, str(exc)))
    return roots


def resolve_path(
    workspace_root: Path | None,
    allowed_roots: list[str],
    raw: Any,
    *,
    expect: Expect = "file",
    must_exist: bool = True,
) -> ResolvedPath:
    """Check ``raw`` (relative to the workspace root, or absolute inside an allowed root) and
    return where it really is. Raises :class:`PathError` with a clear message otherwise.

    With ``must_exist=False`` a missing final name is accepted when its parent directory exists
    inside an allowed root (for creating a file)."""
    if workspace_root is None:
        raise PathError("no_workspace", "this run's workspace has no directory configured ([workspaces] roots)")
    _check_spelling(raw)
    ws_real = os.path.realpath(workspace_root)
    if not os.path.isdir(ws_real):
        raise PathError("no_workspace", "the workspace directory does not exist")
    roots = [r for r in allowed_roots_of(workspace_root, allowed_roots) if r.absolute is not None]
    if not roots:
        raise PathError("outside_roots", "this run has no usable allowed roots (context.allowedRoots)")
    trailing_slash = raw.endswith("/") and raw != "/"
    if raw.startswith("/"):
        candidate = "/" + "/".join(_components(raw))  # no '..' is left; this only tidies '//' and '/.'
    else:
        candidate = os.path.join(ws_real, *_components(raw))
    real = os.path.realpath(candidate)
    by_depth = sorted(roots, key=lambda r: -len(str(r.absolute)))
    root = next((r for r in by_depth if _inside(real, str(r.absolute))), None)
    if root is None:
        labels = ", ".join(r.label or "." for r in roots)
        if real != os.path.normpath(candidate):
            raise PathError(
                "outside_roots", f"{_clip(raw)} goes through a symlink that leads outside the allowed roots ({labels})"
            )
        what = "absolute path " if raw.startswith("/") else ""
        raise PathError("outside_roots", f"{what}{_clip(raw)} is outside the allowed roots ({labels})")
    relative = os.path.relpath(real, ws_real)
    relative = "." if relative == "." else relative.replace(os.sep, "/")
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        st = None
    except NotADirectoryError as exc:
        raise PathError("not_a_directory", f"{_clip(raw)}: a parent of this path is not a directory") from exc
    except OSError as exc:
        raise PathError("path_refused", f"{_clip(raw)}: {exc.strerror}") from exc
    if st is None:
        if os.path.lexists(candidate):
            raise PathError("not_found", f"{_clip(raw)} is a dangling symlink")
        if must_exist or expect == "dir":
            raise PathError("not_found", f"{_clip(raw)} does not exist")
        if trailing_slash:
            raise PathError("not_a_file", f"{_clip(raw)} ends with '/' but a file is expected")
        parent = os.path.dirname(real)
        if not _inside(parent, str(root.absolute)) or not os.path.isdir(parent):
            raise PathError("not_found", f"the parent directory of {_clip(raw)} does not exist")
        return ResolvedPath(Path(real), relative, root.label, Path(ws_real), exists=False)
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise PathError("path_refused", f"{_clip(raw)} is a symlink loop")
    if stat.S_ISDIR(mode):
        if expect == "file":
            raise PathError("not_a_file", f"{_clip(raw)} is a directory; a file is expected")
    elif stat.S_ISREG(mode):
        if expect == "dir":
            raise PathError("not_a_directory", f"{_clip(raw)} is a file; a directory is expected")
        if trailing_slash:
            raise PathError("not_a_directory", f"{_clip(raw)} ends with '/' but names a file")
    else:
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device file"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "not a regular file"
        )
        raise PathError("special_file", f"{_clip(raw)} is {kind}; only regular files can be used")
    return ResolvedPath(Path(real), relative, root.label, Path(ws_real), exists=True)


# -- symlink-proof I/O ---------------------------------------------------------------------------


@contextlib.contextmanager
def _open_parent(resolved: ResolvedPath) -> Iterator[tuple[int, str]]:
    """Yield ``(fd of the parent directory, final name)`` reached from the workspace root one
    component at a time without following any symlink."""
    parts = resolved.parts
    if not parts:
        raise PathError("not_a_file", "the workspace root is a directory, not a file")
    fd = os.open(resolved.workspace_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise PathError(
                    "path_changed",
                    f"{resolved.relative!r}: the directory {name!r} changed (it is now a symlink, missing or not a "
                    f"directory) after the path was checked; nothing was read or written",
                ) from exc
            os.close(fd)
            fd = next_fd
        yield fd, parts[-1]
    finally:
        os.close(fd)


def _open_final(dir_fd: int, name: str, resolved: ResolvedPath) -> int:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError as exc:
        raise PathError("not_found", f"{resolved.relative!r} does not exist") from exc
    except OSError as exc:
        raise PathError(
            "path_changed", f"{resolved.relative!r} changed (it is now a symlink) after the path was checked"
        ) from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PathError("special_file", f"{resolved.relative!r} is not a regular file")
    return fd


def _read_fd(fd: int, max_bytes: int | None, relative: str) -> tuple[bytes, FileVersion]:
    st = os.fstat(fd)
    if max_bytes is not None and st.st_size > max_bytes:
        raise PathError("too_large", f"{relative!r} is {st.st_size} bytes; the limit is {max_bytes}")
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise PathError("too_large", f"{relative!r} grew beyond {max_bytes} bytes while being read")
        chunks.append(chunk)
    data = b"".join(chunks)
    return data, FileVersion(hashlib.sha256(data).hexdigest(), st.st_mtime_ns, len(data))


def read_file_versioned(resolved: ResolvedPath, max_bytes: int | None = None) -> tuple[bytes, FileVersion]:
    """The file's bytes and the version of exactly those bytes, read without following symlinks."""
    with _open_parent(resolved) as (dir_fd, name):
        fd = _open_final(dir_fd, name, resolved)
        try:
            return _read_fd(fd, max_bytes, resolved.relative)
        finally:
            os.close(fd)


def read_file_safely(resolved: ResolvedPath, max_bytes: int | None = None) -> bytes:
    return read_file_versioned(resolved, max_bytes)[0]


def current_version(resolved: ResolvedPath) -> FileVersion | None:
    """The version on disk now, or None when the file does not exist."""
    try:
        return read_file_versioned(resolved)[1]
    except PathError as exc:
        if exc.code == "not_found":
            return None
        raise


def write_file_atomically(
    resolved: ResolvedPath,
    data: bytes,
    *,
    expected_sha256: str | None = None,
    must_not_exist: bool = False,
    new_file_mode: int = 0o644,
) -> FileVersion:
    """Replace (or create) the file with ``data``: temp file in the same directory, fsync, rename.

    The existing file's permission bits (and, when allowed, owner) are kept. With
    ``expected_sha256`` the current bytes are hashed right before the rename and a mismatch
    raises ``stale_version`` with nothing written; ``must_not_exist`` refuses to replace a file
    that appeared since the check. Returns the new version."""
    with _open_parent(resolved) as (dir_fd, name):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISLNK(st.st_mode):
                raise PathError("path_changed", f"{resolved.relative!r} became a symlink after the path was checked")
            if not stat.S_ISREG(st.st_mode):
                raise PathError("not_a_file", f"{resolved.relative!r} is not a regular file")
            if must_not_exist:
                raise PathError("stale_version", f"{resolved.relative!r} was created by someone else meanwhile")
        if expected_sha256 is not None:
            if st is None:
                raise PathError("stale_version", f"{resolved.relative!r} was deleted meanwhile; nothing written")
            fd = _open_final(dir_fd, name, resolved)
            try:
                _, version = _read_fd(fd, None, resolved.relative)
            finally:
                os.close(fd)
            if version.sha256 != expected_sha256:
                raise PathError(
                    "stale_version",
                    f"{resolved.relative!r} changed on disk meanwhile (now {version.sha256[:12]}…); nothing written",
                )
        mode = stat.S_IMODE(st.st_mode) if st is not None else new_file_mode
        tmp = f".ag-tmp-{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fchmod(fd, mode)
                if st is not None:
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, st.st_uid, st.st_gid)
                os.fsync(fd)
                after = os.fstat(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    return FileVersion(hashlib.sha256(data).hexdigest(), after.st_mtime_ns, len(data))
