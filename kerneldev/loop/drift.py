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

Which files are compared (the file set, the workspace hashes, the snapshot) is decided in
`workspace.py`, shared with pull and push.
"""

from __future__ import annotations

import dataclasses
import difflib
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneldev.config import HostConfig
from kerneldev.gitrepo import GitUnavailable, head_commit
from kerneldev.hosts.transport.base import RemoteFile, Transport
from kerneldev.loop.history import Leftovers
from kerneldev.loop.workspace import LocalFile, local_file, resolve_paths, snapshot
from kerneldev.printable import printable
from kerneldev.status_words import StatusWord


class FileStatus(StatusWord):
    """Where a tracked file stands: workspace and live against the base of the last pull/push."""

    IN_SYNC = "in-sync"
    EDITED = "edited"
    DRIFTED = "drifted"
    CONFLICT = "conflict"
    NOT_PULLED = "not-pulled"
    MISSING_LIVE = "missing-live"


class MirrorStatus(StatusWord):
    """The live file against the mirror's git HEAD."""

    SAME = "same"
    DIFFERS = "differs"
    ABSENT = "absent"


IN_SYNC = FileStatus.IN_SYNC
EDITED = FileStatus.EDITED
DRIFTED = FileStatus.DRIFTED
CONFLICT = FileStatus.CONFLICT
NOT_PULLED = FileStatus.NOT_PULLED
MISSING_LIVE = FileStatus.MISSING_LIVE

MIRROR_SAME = MirrorStatus.SAME
MIRROR_DIFFERS = MirrorStatus.DIFFERS
MIRROR_ABSENT = MirrorStatus.ABSENT


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
    leftovers: Leftovers | None = None  # with `leftovers=True`; not part of `as_json`

    @property
    def ok(self) -> bool:
        """True when every file is in sync and no mirror entry differs (diff's exit 0). Zero
        files is never ok: a check of nothing must not pass."""
        return bool(self.files) and all(
            f.status == IN_SYNC and f.mirror != MIRROR_DIFFERS for f in self.files
        )

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
    try:
        commit = head_commit(mirror)
    except GitUnavailable as err:
        return None, f"{err}; the mirror {mirror} is compared without its commit"
    if commit is None:
        return None, f"the mirror {mirror} is not a git repository with a commit; commit is null"
    return commit, None


def compute_drift(
    transport: Transport,
    host: HostConfig,
    paths: list[str] | None = None,
    *,
    patch: bool = False,
    use_mirror: bool = True,
    leftovers: bool = False,
) -> DriftReport:
    """Compare live, workspace, base and mirror for the configured files (or `paths`).
    `leftovers`: also report what interrupted runs left on the host, found in the same
    remote command as the hashes."""
    selected = resolve_paths(host, paths)
    snap = snapshot(transport, host, selected, leftovers=leftovers)
    warnings: list[str] = []

    mirror = host.mirror if use_mirror else None
    commit = None
    if mirror is not None:
        if not Path(mirror).is_dir():
            what = "is not a folder" if Path(mirror).exists() else "does not exist"
            warnings.append(f"the mirror folder {mirror} {what}; mirror column skipped")
            mirror = None
        else:
            commit, warning = mirror_commit(Path(mirror))
            if warning:
                warnings.append(warning)

    report = DriftReport(
        host=host.name, mirror_commit=commit, warnings=warnings, leftovers=snap.leftovers
    )
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
            _add_patches(transport, host, entry, live, local, Path(mirror) if mirror else None)
        report.files.append(entry)
    if not report.files:
        report.warnings.append(f"no file to compare for host '{host.name}'")
    return report


# Files larger than this get sizes and hashes instead of a patch: difflib is quadratic in the
# worst case and a 200 MB diff is of no use on a terminal anyway.
PATCH_MAX_BYTES = 4 << 20
PATCH_MAX_LINES = 5000  # lines of one patch printed; the rest is counted, not shown


@dataclass(frozen=True)
class Version:
    """One side of a patch: its label (`live/<path>`), size and sha256 (None: absent), and how
    to read its bytes (called only when a text patch is made)."""

    label: str
    size: int | None
    sha256: str | None
    read: Callable[[], bytes]


def _add_patches(
    transport: Transport,
    host: HostConfig,
    entry: FileDrift,
    live: RemoteFile | None,
    local: LocalFile | None,
    mirror: Path | None,
) -> None:
    path = entry.path
    # The labels are escaped (`printable`): a control character in a name cannot drive the
    # terminal through a patch header, as it cannot through a table.
    live_v = Version(
        printable(f"live/{path}"),
        live.size if live else None,
        live.sha256 if live else None,
        _cached(lambda: transport.read_bytes(posixpath.join(host.root, path))),
    )
    ws_v = Version(
        printable(f"workspace/{path}"),
        local.size if local else None,
        local.sha256 if local else None,
        _cached(lambda: (Path(host.workspace) / path).read_bytes()),
    )
    if entry.status != IN_SYNC:
        entry.patch = describe_change(live_v, ws_v)
    if mirror is not None and entry.mirror == MIRROR_DIFFERS:
        m = local_file(mirror, path)
        mirror_v = Version(
            printable(f"mirror/{path}"),
            m.size if m else None,
            m.sha256 if m else None,
            lambda: (mirror / path).read_bytes(),
        )
        entry.mirror_patch = describe_change(mirror_v, live_v if live is not None else ws_v)


def _cached(read: Callable[[], bytes]) -> Callable[[], bytes]:
    """Read once: the live file may be needed for both the workspace and the mirror patch."""
    box: list[bytes] = []

    def once() -> bytes:
        if not box:
            box.append(read())
        return box[0]

    return once


def is_binary(data: bytes) -> bool:
    """Not text a terminal can show: a NUL or another control byte (escape sequences), or bytes
    that are not UTF-8."""
    if any(b in data for b in _CONTROL_BYTES):
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# C0 controls except tab, newline, vertical tab, form feed and carriage return; and DEL.
_CONTROL_BYTES = [bytes([c]) for c in (*range(0, 9), *range(14, 32), 127)]


def describe_change(old: Version, new: Version) -> str:
    """A unified diff of two text versions; for binary or very large files one summary line
    per side with size and sha256 (bytes are never printed)."""
    sizes = [v.size for v in (old, new) if v.size is not None]
    if max(sizes, default=0) > PATCH_MAX_BYTES:
        return _summary(
            f"Files {old.label} and {new.label} differ (larger than "
            f"{PATCH_MAX_BYTES >> 20} MiB, not diffed here)",
            old,
            new,
        )
    old_bytes = old.read() if old.size is not None else None
    new_bytes = new.read() if new.size is not None else None
    if any(b is not None and is_binary(b) for b in (old_bytes, new_bytes)):
        return _summary(f"Binary files {old.label} and {new.label} differ", old, new)
    return unified_diff(old_bytes, new_bytes, old.label, new.label)


def _summary(headline: str, *versions: Version) -> str:
    lines = [headline]
    for v in versions:
        if v.size is None:
            lines.append(f"  {v.label}: absent")
        else:
            lines.append(f"  {v.label}: {v.size} bytes, sha256 {v.sha256}")
    return "\n".join(lines) + "\n"


def unified_diff(
    old: bytes | None,
    new: bytes | None,
    old_name: str,
    new_name: str,
    max_lines: int = PATCH_MAX_LINES,
) -> str:
    """A unified diff of two text versions (None = file absent), cut after `max_lines` lines
    with a note saying how many were left out."""
    a = [] if old is None else old.decode("utf-8", errors="replace").splitlines(keepends=True)
    b = [] if new is None else new.decode("utf-8", errors="replace").splitlines(keepends=True)
    lines = difflib.unified_diff(
        a, b, "/dev/null" if old is None else old_name, "/dev/null" if new is None else new_name
    )
    out = []
    left_out = 0
    for line in lines:
        if len(out) >= max_lines:
            left_out += 1
            continue
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if left_out:
        out.append(f"... {left_out} more line(s) of this diff not shown (limit {max_lines})\n")
    return "".join(out)
