"""The file set and the workspace: which files a host's `files` entries (and a command line)
name, the workspace side of every comparison (hashes), and one snapshot of live, workspace and
the last sync. pull, diff and push all select files here, so every command sees the same set.

`files` entries are shell globs matched per path segment (`*`, `?`, `[...]`; not recursive, `*`
skips dotfiles), like the host-side expansion in `hostside/hashfiles.py`. A literal name that
contains glob characters is kept escaped (`star[1].py` -> `star[[]1].py`): the config's
`- path: NAME` form does that, so the rest of the code only ever sees patterns.

A glob entry that matches nothing on the host, in the workspace and in the last sync is an
error (`FileSetError`, exit 2): a typo must not make `kerneldev diff && deploy` pass with no
files. A literal entry names one file; when that file is gone it is reported as `missing-live`
(diff exits 1, pull names it), like a glob's file that matched before and left the host.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import posixpath
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kerneldev.config import HostConfig
from kerneldev.errors import FileSetError, StateError, UsageError
from kerneldev.hosts.transport.base import RemoteFile, Transport
from kerneldev.loop.history import INCOMPLETE, Leftovers, leftovers_in
from kerneldev.loop.state import STATE_DIR, State, load_state, state_path
from kerneldev.loop.sum_cache import SumCache

GLOB_CHARS = "*?["


# --- patterns ---------------------------------------------------------------------------


def glob_escape(path: str) -> str:
    """A literal path as a pattern that matches only itself (names may contain `[`, `*`)."""
    return glob.escape(path)


def literal_path(pattern: str) -> str | None:
    """The one path a pattern can match when it uses no glob (only escapes like `[[]`), else
    None: `a/star[[]1].py` -> `a/star[1].py`, `a/*.py` -> None."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[" and pattern[i + 2 : i + 3] == "]" and pattern[i + 1 : i + 2] in set(GLOB_CHARS):
            out.append(pattern[i + 1])
            i += 3
        elif c in GLOB_CHARS:
            return None
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_glob(pattern: str) -> bool:
    return literal_path(pattern) is None


def display_pattern(pattern: str) -> str:
    """How an entry is shown to the user: a literal name as itself, a glob as written."""
    literal = literal_path(pattern)
    return pattern if literal is None else literal


def path_matches(path: str, pattern: str) -> bool:
    """Shell-glob semantics per path segment: `*` never crosses `/` nor matches a leading dot,
    like the host-side expansion."""
    segs, pats = path.split("/"), pattern.split("/")
    if len(segs) != len(pats):
        return False
    for seg, pat in zip(segs, pats, strict=True):
        if not fnmatch.fnmatchcase(seg, pat):
            return False
        if seg.startswith(".") and not pat.startswith("."):
            return False
    return True


def is_configured(host: HostConfig, path: str) -> bool:
    return any(path_matches(path, p) for p in host.files)


# --- selection from the command line ----------------------------------------------------


def resolve_paths(host: HostConfig, paths: list[str] | None) -> list[str] | None:
    """Root-relative paths for PATHS given on the command line, or None for "all files".

    A path may point into the workspace (`dsv4-live/python/...`, absolute or relative to the
    current folder), be an absolute path under the host's root, or be relative to the root.
    A command-line path is always literal (`star[1].py` names that file). A path outside the
    configured `files` is a usage error (exit 2).
    """
    if not paths:
        return None
    workspace = Path(os.path.abspath(host.workspace))
    out: list[str] = []
    for raw in paths:
        rel = _to_root_relative(host, workspace, raw)
        if rel is None or not is_configured(host, rel):
            raise UsageError(
                f"'{raw}' is not one of the files configured for host '{host.name}'",
                hint="configured: " + ", ".join(display_pattern(p) for p in host.files),
            )
        if rel not in out:
            out.append(rel)
    return out


def _to_root_relative(host: HostConfig, workspace: Path, raw: str) -> str | None:
    expanded = os.path.expanduser(raw)
    local = Path(os.path.normpath(os.path.abspath(expanded)))
    rel = _relative_to(local, workspace)
    if rel is None:
        # The workspace, or the user's path, through a symlink (the current folder is always
        # the real one): compare the real folders; the file's own name is not followed.
        real = Path(os.path.realpath(local.parent)) / local.name
        rel = _relative_to(real, Path(os.path.realpath(workspace)))
    if rel is None and posixpath.isabs(expanded):
        norm = posixpath.normpath(expanded)
        root = host.root.rstrip("/") or "/"
        if not norm.startswith(root.rstrip("/") + "/"):
            return None
        rel = norm[len(root.rstrip("/")) + 1 :]
    elif rel is None:
        rel = posixpath.normpath(expanded.replace(os.sep, "/"))
    if rel in (".", "") or rel == ".." or rel.startswith("../"):
        return None
    return rel


def _relative_to(path: Path, folder: Path) -> str | None:
    if path == folder or folder in path.parents:
        return path.relative_to(folder).as_posix()
    return None


def hash_patterns(host: HostConfig, selected: list[str] | None) -> list[str]:
    """What to hand to `Transport.hash_files`: the configured patterns, or the selected paths
    escaped so a name containing `[` or `*` matches only itself."""
    if selected is None:
        return list(host.files)
    return [glob_escape(p) for p in selected]


# --- the workspace ----------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    path: str
    sha256: str
    size: int
    mode: int


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def local_file(folder: Path, path: str, sums: SumCache | None = None) -> LocalFile | None:
    """Hash `<folder>/<path>`; None when it does not exist (or is not a regular file).
    `sums`: the workspace's remembered sums, used where the file's `stat` shows it unchanged."""
    full = Path(folder) / path
    try:
        st = full.stat()
        if not stat.S_ISREG(st.st_mode):
            return None
        known = sums.lookup(path, st) if sums is not None else None
        if known is not None:
            return LocalFile(path, known, st.st_size, stat.S_IMODE(st.st_mode))
        digest = hashlib.sha256()
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            after = os.fstat(f.fileno()) if sums is not None else st
    except (FileNotFoundError, NotADirectoryError):
        return None
    sha256 = digest.hexdigest()
    if sums is not None:
        sums.remember(path, st, after, sha256)
    return LocalFile(path, sha256, st.st_size, stat.S_IMODE(st.st_mode))


def workspace_matches(workspace: Path, patterns: tuple[str, ...] | list[str]) -> set[str]:
    """Workspace files matched by the configured patterns (the state folder never is)."""
    found: set[str] = set()
    base = glob.escape(str(workspace))
    for pattern in patterns:
        for match in glob.glob(base + "/" + pattern):
            rel = Path(match).relative_to(workspace).as_posix()
            if rel.split("/")[0] == STATE_DIR or not os.path.isfile(match):
                continue
            found.add(rel)
    return found


# --- the snapshot -----------------------------------------------------------------------


@dataclass
class Snapshot:
    """Live, workspace and base for a set of paths, gathered in one host round trip."""

    paths: list[str]
    live: dict[str, RemoteFile]
    local: dict[str, LocalFile | None]
    state: State
    leftovers: Leftovers | None = None  # with `leftovers=True`: what interrupted runs left
    root_exists: bool | None = None  # with `leftovers=True`: whether root exists on the host
    lock: dict | None = None  # with `lock`: the host lock's outcome (`HostScan.lock`)


def snapshot(
    transport: Transport,
    host: HostConfig,
    selected: list[str] | None,
    *,
    leftovers: bool = False,
    lock: Callable[[dict[str, str]], dict] | None = None,
    remember: bool = True,
) -> Snapshot:
    """The files to act on (`selected`, or every file the configured entries match on the host,
    in the workspace or in the last sync) with their three sides. Raises `FileSetError` when a
    configured glob matches nothing anywhere. `leftovers`: also look for what interrupted runs
    left on the host and whether root exists, in the same round trip. `lock(workspace files)`:
    the scan request's `lock` part (`HostLock.scan_request`), given every workspace file that
    can be in the snapshot (path -> sha256), so the host can tell whether anything can change.
    `remember`: keep what was hashed in the workspace's sums cache (off: nothing is written)."""
    # The host starts (a one-shot connection's login shell and agent: 0.2-0.5 s) while the
    # workspace is hashed below, instead of after it.
    transport.begin()
    state = load_state(host.workspace, host.name)
    check_state_owner(state, host)
    patterns = hash_patterns(host, selected)
    sums = SumCache.load(host.workspace, writable=remember)
    found, root_exists, held = None, None, None
    # Every workspace file the snapshot can hold (for a lock: more only keeps it longer); the
    # files only the host has are hashed after its answer.
    if selected is not None:
        candidates = set(selected)
    else:
        candidates = {p for p in state.files if is_configured(host, p)}
        candidates |= workspace_matches(host.workspace, host.files)
        candidates |= {lit for p in host.files if (lit := literal_path(p)) is not None}

    def hash_workspace() -> dict[str, LocalFile | None]:
        return {p: local_file(host.workspace, p, sums) for p in sorted(candidates)}

    # Without a lock the host's request needs no workspace sums: they are taken on a thread
    # while the host answers (reads and sha256 release the GIL), not before it is asked.
    pending = _Background(hash_workspace) if lock is None else None
    hashed = hash_workspace() if pending is None else {}
    try:
        if leftovers:
            request = None
            if lock is not None:
                request = lock({p: f.sha256 for p, f in hashed.items() if f is not None})
            scan = transport.scan(host.root, patterns, markers=INCOMPLETE, lock=request)
            live_files, root_exists, held = scan.files, scan.root_exists, scan.lock
            found = leftovers_in(scan.found, host.root)
            if lock is not None and (held or {}).get("state") != "taken":
                # Not scanned under the lock (busy, or the transport cannot take it): the
                # caller takes it the usual way and scans again.
                return Snapshot([], {}, {}, state, found, root_exists, held)
        else:
            live_files, _ = transport.hash_files(host.root, patterns)
    except BaseException:
        if pending is not None:
            pending.wait()  # the host's error is the one to report; the thread ends first
        raise
    if pending is not None:
        hashed = pending.result()
    live = {f.path: f for f in live_files}
    if selected is not None:
        paths = set(selected)  # a named file that is missing live shows up as missing-live
    else:
        paths = set(live)
        paths |= {p for p in state.files if is_configured(host, p)}
        paths |= workspace_matches(host.workspace, host.files)
        empty = [p for p in host.files if is_glob(p) and not any(path_matches(x, p) for x in paths)]
        if empty or (not paths and not _root_exists(transport, host, root_exists)):
            # Nothing anywhere: a typo in `files`, or in `root` (named when that is the cause).
            raise _empty_entries_error(transport, host, empty or list(host.files))
        # A literal entry is a file of its own: when it is nowhere it is reported as such
        # (missing-live; pull names it), like a file deleted on the host.
        paths |= {lit for p in host.files if (lit := literal_path(p)) is not None}
    ordered = sorted(paths)
    local = {p: hashed[p] if p in hashed else local_file(host.workspace, p, sums) for p in ordered}
    sums.save()
    return Snapshot(ordered, live, local, state, found, root_exists, held)


class _Background:
    """`work()` on a thread of its own: `result()` waits for it, then returns what it returned
    or raises what it raised."""

    def __init__(self, work: Callable[[], dict]) -> None:
        self._result: dict = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], dict]) -> None:
        try:
            self._result = work()
        except BaseException as err:  # noqa: BLE001 - raised again by result(), in the caller
            self._error = err

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> dict:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result


def _root_exists(transport: Transport, host: HostConfig, known: bool | None) -> bool:
    return known if known is not None else transport.exists(host.root)


def _empty_entries_error(transport: Transport, host: HostConfig, empty: list[str]) -> FileSetError:
    """Name the entries and the likeliest cause (only this path pays the extra round trips)."""
    names = ", ".join(f"'{display_pattern(p)}'" for p in empty)
    message = (
        f"host '{host.name}': files entr{'ies' if len(empty) > 1 else 'y'} {names} match"
        f"{'' if len(empty) > 1 else 'es'} no file on the host under {host.root}, in the "
        "workspace or in its last sync"
    )
    if not transport.exists(host.root):
        return FileSetError(
            message + f"; the root {host.root} does not exist on the host",
            hint=f"check `root:` of host '{host.name}' in the config",
        )
    globs = [p for p in empty if is_glob(p)]
    if globs:
        literal, _ = transport.hash_files(host.root, [glob_escape(p) for p in globs])
        if literal:
            name = literal[0].path
            return FileSetError(
                message,
                hint=f"'{name}' exists as a literal name; track it with `- path: {name}` "
                "(glob characters in `path:` entries are taken literally)",
            )
    return FileSetError(
        message,
        hint="fix or remove the entry in `files:` (globs match within one folder, like the "
        "shell; a literal name with glob characters is written `- path: NAME`)",
    )


def check_state_owner(state: State, host: HostConfig) -> None:
    """A workspace belongs to one host and root, or is shared by the hosts of a group (each
    with its own record, `host.workspace_peers`): bases recorded for another host would make
    every status (and push's drift check) meaningless."""
    if state.host is None:
        strangers = [o for o in state.others if o not in host.workspace_peers]
        if strangers:
            # Renamed hosts are the usual cause in a group: name the records to rename.
            rename = (
                f"if you renamed the host(s), rename the records in {state_path(host.workspace)} "
                "(its top-level 'host' and the keys of 'hosts')"
            )
            if host.workspace_peers:
                hint = (
                    f"'{host.name}' shares this workspace with {', '.join(host.workspace_peers)} "
                    f"(a group), but it holds records of {', '.join(strangers)}, not in that "
                    f"group: give the group its own `workspace:`; {rename}"
                )
            else:
                hint = (
                    "give each host its own `workspace:`, or put the hosts that share it in a "
                    f"group (`groups:` in hosts.yaml); {rename}"
                )
            raise StateError(
                f"the workspace {host.workspace} belongs to host '{strangers[0]}', "
                f"not to '{host.name}' (root {host.root})",
                hint=hint,
            )
        return
    if (state.host, state.root) != (host.name, host.root):
        raise StateError(
            f"the workspace {host.workspace} belongs to host '{state.host}' (root {state.root}), "
            f"not to '{host.name}' (root {host.root})",
            hint="give each host its own `workspace:`; if you renamed the host or moved its "
            f"root, edit 'host' and 'root' in {state_path(host.workspace)}",
        )
