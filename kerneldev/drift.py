"""Workspace vs live vs the last sync vs the mirror: what `kerneldev diff` reports.

Three hashes per file decide the status: live (on the host), workspace (local copy) and base
(live as recorded at the last pull/push, see `state.py`):

- `in-sync`      workspace == live
- `edited`       workspace changed since the last sync, live did not (push it)
- `drifted`      live changed since the last sync, workspace did not (someone edited the host)
- `conflict`     both changed and differ (or they differ and no sync was ever recorded)
- `not-pulled`   on the host, not in the workspace
- `missing-live` not on the host (deleted there, or a new local file not pushed yet)

The mirror column compares the mirror's working tree (`<mirror>/<path>`) with live (with the
workspace when the file is missing on live): `same`, `differs`, `absent` (not in the mirror),
or None when no mirror is configured.

The path helpers used by pull and push (which files a command line names, how to hash the
workspace) live here too, so every command selects files the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import glob
import hashlib
import os
import posixpath
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneldev.config import HostConfig
from kerneldev.errors import UsageError
from kerneldev.state import STATE_DIR, State, StateError, load_state, state_path
from kerneldev.transport.base import RemoteFile, Transport

IN_SYNC = "in-sync"
EDITED = "edited"
DRIFTED = "drifted"
CONFLICT = "conflict"
NOT_PULLED = "not-pulled"
MISSING_LIVE = "missing-live"

MIRROR_SAME = "same"
MIRROR_DIFFERS = "differs"
MIRROR_ABSENT = "absent"

_GLOB_CHARS = set("*?[")


@dataclass
class FileDrift:
    path: str
    status: str
    mirror: str | None
    live_sha256: str | None = None
    workspace_sha256: str | None = None
    base_sha256: str | None = None
    mirror_sha256: str | None = None
    live_mode: int | None = None
    note: str | None = None
    patch: str | None = None  # live -> workspace, with --patch
    mirror_patch: str | None = None  # mirror -> live (or workspace), with --patch


@dataclass
class DriftReport:
    host: str
    mirror_commit: str | None
    files: list[FileDrift] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every file is in sync and no mirror entry differs (diff's exit 0)."""
        return all(f.status == IN_SYNC and f.mirror != MIRROR_DIFFERS for f in self.files)

    def as_json(self) -> dict[str, Any]:
        """The documented `diff --json` shape: exactly host, mirror_commit and files."""
        files = []
        for f in self.files:
            entry = dataclasses.asdict(f)
            for key in ("patch", "mirror_patch"):
                if entry[key] is None:
                    del entry[key]
            files.append(entry)
        return {"host": self.host, "mirror_commit": self.mirror_commit, "files": files}


# --- path selection ---------------------------------------------------------------------


def is_glob(pattern: str) -> bool:
    return any(c in _GLOB_CHARS for c in pattern)


def glob_escape(path: str) -> str:
    """A literal path as a pattern that matches only itself (names may contain `[`, `*`)."""
    return glob.escape(path)


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


def resolve_paths(host: HostConfig, paths: list[str] | None) -> list[str] | None:
    """Root-relative paths for PATHS given on the command line, or None for "all files".

    A path may point into the workspace (`dsv4-live/python/...`, absolute or relative to the
    current folder), be an absolute path under the host's root, or be relative to the root.
    A path outside the configured `files` is a usage error (exit 2).
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
                hint="configured: " + ", ".join(host.files),
            )
        if rel not in out:
            out.append(rel)
    return out


def _to_root_relative(host: HostConfig, workspace: Path, raw: str) -> str | None:
    expanded = os.path.expanduser(raw)
    local = Path(os.path.normpath(os.path.abspath(expanded)))
    if local == workspace or workspace in local.parents:
        rel = local.relative_to(workspace).as_posix()
    elif posixpath.isabs(expanded):
        norm = posixpath.normpath(expanded)
        root = host.root.rstrip("/") or "/"
        if not norm.startswith(root.rstrip("/") + "/"):
            return None
        rel = norm[len(root.rstrip("/")) + 1 :]
    else:
        rel = posixpath.normpath(expanded.replace(os.sep, "/"))
    if rel in (".", "") or rel == ".." or rel.startswith("../"):
        return None
    return rel


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


def local_file(folder: Path, path: str) -> LocalFile | None:
    """Hash `<folder>/<path>`; None when it does not exist (or is not a regular file)."""
    full = Path(folder) / path
    try:
        st = full.stat()
        if not stat.S_ISREG(st.st_mode):
            return None
        digest = hashlib.sha256()
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return LocalFile(path, digest.hexdigest(), st.st_size, stat.S_IMODE(st.st_mode))


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


@dataclass
class Snapshot:
    """Live, workspace and base for a set of paths, gathered in one host round trip."""

    paths: list[str]
    live: dict[str, RemoteFile]
    local: dict[str, LocalFile | None]
    state: State
    unmatched: list[str]


def snapshot(transport: Transport, host: HostConfig, selected: list[str] | None) -> Snapshot:
    state = load_state(host.workspace)
    check_state_owner(state, host)
    live_files, unmatched = transport.hash_files(host.root, hash_patterns(host, selected))
    live = {f.path: f for f in live_files}
    if selected is not None:
        paths = set(selected)
        unmatched = []  # a named file that is missing live shows up as missing-live
    else:
        paths = set(live)
        paths |= {p for p in state.files if is_configured(host, p)}
        paths |= workspace_matches(host.workspace, host.files)
        paths |= {p for p in host.files if not is_glob(p)}
        # Globs that match nothing anywhere are worth a warning; literal paths are reported
        # as files (missing-live) instead.
        unmatched = [
            p for p in unmatched if is_glob(p) and not any(path_matches(x, p) for x in paths)
        ]
    ordered = sorted(paths)
    local = {p: local_file(host.workspace, p) for p in ordered}
    return Snapshot(ordered, live, local, state, unmatched)


def check_state_owner(state: State, host: HostConfig) -> None:
    """One workspace belongs to one host and root: bases recorded for another would make every
    status (and push's drift check) meaningless."""
    if state.host is None:
        return
    if (state.host, state.root) != (host.name, host.root):
        raise StateError(
            f"the workspace {host.workspace} belongs to host '{state.host}' (root {state.root}), "
            f"not to '{host.name}' (root {host.root})",
            hint="give each host its own `workspace:`; if you renamed the host or moved its "
            f"root, edit 'host' and 'root' in {state_path(host.workspace)}",
        )


def classify(live: str | None, workspace: str | None, base: str | None) -> tuple[str, str | None]:
    """Status of workspace vs live, plus a note when the reason is not obvious."""
    if live is None:
        return MISSING_LIVE, None
    if workspace is None:
        return NOT_PULLED, None
    if workspace == live:
        return IN_SYNC, None
    if base is None:
        return CONFLICT, "workspace and live differ and no pull/push was recorded"
    if live == base:
        return EDITED, None
    if workspace == base:
        return DRIFTED, None
    return CONFLICT, None


# --- the report -------------------------------------------------------------------------


def mirror_commit(mirror: Path) -> tuple[str | None, str | None]:
    """(HEAD commit of the mirror, warning). The commit is None when it cannot be read."""
    git = shutil.which("git")
    if git is None:
        return None, f"git is not installed; the mirror {mirror} is compared without its commit"
    try:
        proc = subprocess.run(
            [git, "-C", str(mirror), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"cannot run git in the mirror {mirror}: {err}"
    if proc.returncode != 0:
        return None, f"the mirror {mirror} is not a git repository with a commit; commit is null"
    return proc.stdout.strip(), None


def compute_drift(
    transport: Transport,
    host: HostConfig,
    paths: list[str] | None = None,
    *,
    patch: bool = False,
    use_mirror: bool = True,
) -> DriftReport:
    """Compare live, workspace, base and mirror for the configured files (or `paths`)."""
    selected = resolve_paths(host, paths)
    snap = snapshot(transport, host, selected)
    warnings = [
        f"pattern '{p}' matches no file on the host or in the workspace" for p in snap.unmatched
    ]

    mirror = host.mirror if use_mirror else None
    commit = None
    if mirror is not None:
        if not Path(mirror).is_dir():
            warnings.append(f"the mirror folder {mirror} does not exist; mirror column skipped")
            mirror = None
        else:
            commit, warning = mirror_commit(Path(mirror))
            if warning:
                warnings.append(warning)

    report = DriftReport(host=host.name, mirror_commit=commit, warnings=warnings)
    for path in snap.paths:
        live = snap.live.get(path)
        local = snap.local[path]
        base = snap.state.files.get(path)
        status, note = classify(
            live.sha256 if live else None,
            local.sha256 if local else None,
            base.sha256 if base else None,
        )
        entry = FileDrift(
            path=path,
            status=status,
            mirror=None,
            live_sha256=live.sha256 if live else None,
            workspace_sha256=local.sha256 if local else None,
            base_sha256=base.sha256 if base else None,
            live_mode=live.mode if live else None,
            note=note,
        )
        if mirror is not None:
            m = local_file(Path(mirror), path)
            entry.mirror_sha256 = m.sha256 if m else None
            against = entry.live_sha256 or entry.workspace_sha256
            if m is None:
                entry.mirror = MIRROR_ABSENT
            else:
                entry.mirror = MIRROR_SAME if m.sha256 == against else MIRROR_DIFFERS
        if patch:
            _add_patches(transport, host, entry, Path(mirror) if mirror else None)
        report.files.append(entry)
    return report


def _add_patches(
    transport: Transport, host: HostConfig, entry: FileDrift, mirror: Path | None
) -> None:
    live_bytes: bytes | None = None
    if entry.live_sha256 is not None and (
        entry.status != IN_SYNC or entry.mirror == MIRROR_DIFFERS
    ):
        live_bytes = transport.read_bytes(posixpath.join(host.root, entry.path))
    ws_bytes = None
    if entry.workspace_sha256 is not None:
        ws_bytes = (Path(host.workspace) / entry.path).read_bytes()
    if entry.status != IN_SYNC:
        entry.patch = unified_diff(
            live_bytes, ws_bytes, f"live/{entry.path}", f"workspace/{entry.path}"
        )
    if mirror is not None and entry.mirror == MIRROR_DIFFERS:
        mirror_bytes = (mirror / entry.path).read_bytes()
        if live_bytes is not None:
            entry.mirror_patch = unified_diff(
                mirror_bytes, live_bytes, f"mirror/{entry.path}", f"live/{entry.path}"
            )
        else:
            entry.mirror_patch = unified_diff(
                mirror_bytes, ws_bytes, f"mirror/{entry.path}", f"workspace/{entry.path}"
            )


def unified_diff(old: bytes | None, new: bytes | None, old_name: str, new_name: str) -> str:
    """A unified diff of two versions (None = file absent); binary bytes are shown decoded."""
    a = [] if old is None else old.decode("utf-8", errors="replace").splitlines(keepends=True)
    b = [] if new is None else new.decode("utf-8", errors="replace").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a, b, "/dev/null" if old is None else old_name, "/dev/null" if new is None else new_name
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
