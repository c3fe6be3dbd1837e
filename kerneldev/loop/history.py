"""The host's shared deploy history and the housekeeping of its backups.

Every deploy (push, rollback, automatic rollback), by any engineer from any workspace, is
appended as one JSON line to `<root>/.kerneldev/history.jsonl` while the host lock is held, so
`kerneldev log` and `kerneldev rollback` see everyone's deploys, not only this workspace's.
Each line is a `DeployRecord` (see `state.py`) plus `"schema": HISTORY_SCHEMA`.

Backups live in `<root>/.kerneldev/backups/<deploy-id>/<path>`. A deploy's folder holds an
`.incomplete` marker from before its first backup until its record is in the history. The
marker holds the planned record (every file with its old and new sha256), so a marked folder
without a running deploy (an interrupted or cut-off one) can be settled exactly later: files
whose live bytes are the planned new ones landed and are recorded; if none landed, the
folder's backups are not needed and are removed (see `clean_leftovers`).
"""

from __future__ import annotations

import glob
import json
import posixpath
import shlex
from dataclasses import asdict, dataclass, field

from kerneldev.errors import TransferError
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop.state import DeployRecord, deploy_from_dict
from kerneldev.paths import HOST_BACKUPS, HOST_HISTORY, KERNELDEV_DIR

HISTORY_FILE = HOST_HISTORY  # under the host's root
BACKUP_DIR = HOST_BACKUPS
INCOMPLETE = ".incomplete"  # marker file inside a backup folder
HISTORY_SCHEMA = 1
DEFAULT_KEEP = 20  # deploys whose backups are kept (config: keep_backups)


@dataclass
class History:
    records: list[DeployRecord] = field(default_factory=list)
    unreadable_lines: int = 0  # lines that did not parse (shown as a warning, never fatal)

    def find(self, deploy_id: str) -> DeployRecord | None:
        return next((r for r in self.records if r.id == deploy_id), None)

    @property
    def ids(self) -> set[str]:
        return {r.id for r in self.records}


def history_path(root: str) -> str:
    return posixpath.join(root, HISTORY_FILE)


def backup_folder(root: str, deploy_id: str) -> str:
    return posixpath.join(root, BACKUP_DIR, deploy_id)


def record_line(record: DeployRecord) -> str:
    return json.dumps({"schema": HISTORY_SCHEMA, **asdict(record)}, ensure_ascii=True) + "\n"


def parse_history(text: str) -> History:
    history = History()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if raw.pop("schema", HISTORY_SCHEMA) > HISTORY_SCHEMA:
                raise ValueError("newer schema")
            record = deploy_from_dict(raw)
            if not all(_stays_in_root(f.path, f.backup) for f in record.files):
                raise ValueError("a path that leaves root")
            history.records.append(record)
        except (ValueError, TypeError, KeyError, AttributeError):
            history.unreadable_lines += 1
    history.records.sort(key=lambda r: r.id)  # ids sort by time
    return history


def _stays_in_root(path: object, backup: object) -> bool:
    """The history is a file on the host that anyone there can edit: rollback restores what it
    names, so a line whose file is not a plain root-relative path (absolute, `..`, inside
    .kerneldev/) or whose backup is not under the backups folder counts as unreadable, rather
    than letting a rollback read or write outside root."""

    def relative(p: object) -> bool:
        return isinstance(p, str) and bool(p) and not p.startswith("/") and ".." not in p.split("/")

    if not relative(path) or str(path).split("/")[0] == KERNELDEV_DIR:
        return False
    return backup is None or (relative(backup) and str(backup).startswith(BACKUP_DIR + "/"))


def load_history(transport: Transport, root: str) -> History:
    path = history_path(root)
    if not transport.exists(path):
        return History()
    return parse_history(transport.read_bytes(path).decode("utf-8", "replace"))


def append_record(transport: Transport, root: str, record: DeployRecord, then: str = "") -> None:
    """Append the record (caller holds the host lock), then drop the backup folder's marker;
    `then`: a shell command run after that, in the same remote command (a lock release)."""
    marker = shlex.quote(posixpath.join(backup_folder(root, record.id), INCOMPLETE))
    after = f"rm -f -- {marker}" + (f" && {then}" if then else "")
    transport.append_text(history_path(root), record_line(record), then=after)


def mark_incomplete(transport: Transport, root: str, planned: DeployRecord) -> None:
    """Write the marker holding the planned record, before the first backup is made."""
    path = posixpath.join(backup_folder(root, planned.id), INCOMPLETE)
    transport.write_atomic(path, record_line(planned).encode("utf-8"))


def _scan(transport: Transport, root: str) -> tuple[list[str], list[str]]:
    """(kerneldev temporary files under root, deploy ids of marked backup folders): one
    `find` on the host."""
    return _split(transport.find_temp_files(root, markers=INCOMPLETE), root)


def leftovers_in(found: list[str], root: str) -> Leftovers:
    """The leftovers among `found`, what `Transport.scan(root, ..., markers=INCOMPLETE)`
    returned (the snapshot's round trip already looked, so no second `find`)."""
    return Leftovers(*_split(found, root))


def _split(found: list[str], root: str) -> tuple[list[str], list[str]]:
    backups = posixpath.join(root, BACKUP_DIR) + "/"
    temps, marked = [], []
    for path in found:
        if posixpath.basename(path) != INCOMPLETE:
            temps.append(path)
        elif path.startswith(backups) and path[len(backups) :].count("/") == 1:
            marked.append(path[len(backups) :].split("/")[0])
    return temps, sorted(marked)


@dataclass
class Leftovers:
    temp_files: list[str] = field(default_factory=list)  # absolute paths on the host
    incomplete_backups: list[str] = field(default_factory=list)  # deploy ids

    def __bool__(self) -> bool:
        return bool(self.temp_files or self.incomplete_backups)

    def describe(self) -> str:
        parts = []
        if self.temp_files:
            parts.append(f"{len(self.temp_files)} temporary file(s)")
        if self.incomplete_backups:
            parts.append(f"incomplete backups of {', '.join(self.incomplete_backups)}")
        return " and ".join(parts)


def find_leftovers(transport: Transport, root: str) -> Leftovers:
    """What interrupted runs left on the host (read-only)."""
    return Leftovers(*_scan(transport, root))


def clean_leftovers(
    transport: Transport, root: str, past: History, found: Leftovers | None = None
) -> tuple[Leftovers, list[str]]:
    """Remove leftovers of interrupted runs (caller holds the lock, so none is running).
    Returns (what was removed, notes). A marked backup folder is settled from the planned record
    in its marker: the files whose live bytes are the planned new ones landed, and the record of
    those is appended to the history; when none landed, the folder is removed. `found`: what a
    scan made under the same lock saw (else the host is searched here)."""
    removed = Leftovers()
    notes: list[str] = []
    if found is None:
        temps, marked = _scan(transport, root)
    else:
        temps, marked = list(found.temp_files), list(found.incomplete_backups)
    for path in temps:
        transport.remove(path)
    removed.temp_files = temps
    for deploy_id in marked:
        folder = backup_folder(root, deploy_id)
        marker = posixpath.join(folder, INCOMPLETE)
        if deploy_id in past.ids:
            transport.run(f"rm -f -- {shlex.quote(marker)}")
            continue
        planned = parse_history(transport.read_bytes(marker).decode("utf-8", "replace"))
        if not planned.records:  # unreadable marker: keep the backups, say so
            notes.append(f"kept the backups of the interrupted deploy {deploy_id} ({folder})")
            continue
        record = planned.records[0]
        live, _ = transport.hash_files(root, [glob.escape(f.path) for f in record.files])
        live_sha = {f.path: f.sha256 for f in live}
        record.files = [
            f
            for f in record.files
            if live_sha.get(f.path) == f.new_sha256 and f.new_sha256 != f.old_sha256
        ]
        if not record.files:
            transport.remove(folder)
            removed.incomplete_backups.append(deploy_id)
            continue
        record.complete, record.outcome = False, "interrupted"
        append_record(transport, root, record)
        past.records.append(record)
        notes.append(
            f"recorded the interrupted {record.kind} {deploy_id} in the host's history: "
            f"it had deployed {', '.join(f.path for f in record.files)}"
        )
    return removed, notes


def prune_backups(transport: Transport, root: str, history: History, keep: int) -> list[str]:
    """Remove backup folders of deploys older than the last `keep` in the history, except
    those a live file still needs: a deploy whose new bytes are still live (undoing it needs
    its backups). Returns the deploy ids pruned."""
    old = history.records[:-keep] if keep > 0 else list(history.records)
    if not old:
        return []  # the common case: no round trip at all
    present = set(_list_dirs(transport, posixpath.join(root, BACKUP_DIR)))
    candidates = [r for r in old if r.id in present]
    if not candidates:
        return []
    paths = sorted({f.path for r in candidates for f in r.files})
    live, _ = transport.hash_files(root, [glob.escape(p) for p in paths])
    live_sha = {f.path: f.sha256 for f in live}
    pruned = []
    for record in candidates:
        if any(
            f.new_sha256 is not None and live_sha.get(f.path) == f.new_sha256 for f in record.files
        ):
            continue
        transport.remove(backup_folder(root, record.id))
        pruned.append(record.id)
    return pruned


def _list_dirs(transport: Transport, folder: str) -> list[str]:
    result = transport.run(
        f'cd {shlex.quote(folder)} 2>/dev/null && for d in */; do [ -d "$d" ] && '
        'printf "%s\\n" "${d%/}"; done; exit 0'
    )
    if not result.ok:
        raise TransferError(f"cannot list {folder} on {transport.host_name}")
    return [line for line in result.stdout.splitlines() if line]
