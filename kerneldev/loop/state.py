"""What kerneldev remembers about a workspace: `<workspace>/.kerneldev/state.json`.

Per tracked file, the "base": sha256, size and mode of the live file at the last pull or push
(what live was when workspace and live were last known to agree). Drift detection compares the
workspace and live against it. Also the list of deploys (push and rollback), each naming the
files it replaced, their old and new sha256 and where the old bytes were backed up on the host.

The file is written atomically (temporary file + `os.replace`), so a crash never leaves half a
state behind. Writers go through `update_state`: under an exclusive lock on
`<workspace>/.kerneldev/state.lock` it reads the file afresh, applies the change and writes it,
so two terminals on one workspace never drop each other's deploy records; a change that changes
nothing (a no-op pull or push: a base set again to what it was keeps its `synced_at`) is not
written. A file that cannot be read or parsed is a `StateError` naming it, never a traceback.

One workspace may be shared by several hosts (the hosts of a group with the same `workspace:`,
one set of edits for the whole fleet). Each host keeps its own record (bases and deploys) in it,
so two hosts never overwrite each other's: every reader and writer names its host. The schema
(version 3):

    {
      "version": 3,
      "host": "node0", "root": "/srv/sglang",          # the first host that used the workspace
      "files": {"<path>": {FileState}}, "deploys": [{DeployRecord}],
      "hosts": {                                       # every further host sharing it
        "node1": {"root": "/srv/sglang", "files": {...}, "deploys": [...]}
      }
    }

A workspace of one host looks as it did in version 2 (plus `"hosts": {}`), so tools that read
its `files` and `deploys` keep working. Schema versions: 1 (no `outcome` on deploy records) and
2 (one host per workspace) are read as they are (their record is the first host's) and written
back as version 3 on the next change. A newer version than this kerneldev knows is refused.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import fcntl
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.errors import ConfigError, KerneldevError, StateError
from kerneldev.paths import KERNELDEV_DIR

STATE_DIR = KERNELDEV_DIR
STATE_FILE = "state.json"
STATE_LOCK = "state.lock"
STATE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)


@dataclass
class FileState:
    """The live file as it was at the last pull/push: the base for drift detection."""

    path: str
    sha256: str
    size: int
    mode: int
    synced_at: str  # ISO 8601 UTC
    synced_by: str  # "pull", "push" or "rollback"


@dataclass
class DeployedFile:
    """One file replaced on the host by a deploy."""

    path: str
    old_sha256: str | None  # None: the file did not exist on the host before
    new_sha256: str | None  # None: the deploy removed the file (rollback of a created file)
    old_mode: int | None
    new_mode: int | None
    backup: str | None  # root-relative path of the old bytes on the host; None when no old file


@dataclass
class DeployRecord:
    id: str
    time: str
    host: str
    user: str
    kind: str  # "push" or "rollback"
    files: list[DeployedFile] = field(default_factory=list)
    complete: bool = True  # False when an upload failed midway; `files` lists what did land
    rolls_back: str | None = None  # for kind == "rollback": the deploy it undid
    # "deployed", "partial" (stopped by an error), "interrupted" (Ctrl-C/SIGTERM/cut connection
    # after some files landed), "auto-rollback" (undid a deploy whose service never got healthy)
    outcome: str = "deployed"


@dataclass
class State:
    """One host's record in a workspace's state file."""

    host: str | None = None
    root: str | None = None
    files: dict[str, FileState] = field(default_factory=dict)
    deploys: list[DeployRecord] = field(default_factory=list)
    # Not saved: the other hosts with a record in the same workspace (when this host has none
    # yet, they are whom the workspace belongs to; see workspace.check_state_owner).
    others: list[str] = field(default_factory=list)

    def set_base(
        self, path: str, sha256: str, size: int, mode: int, synced_by: str, when: str | None = None
    ) -> None:
        known = self.files.get(path)
        if known is not None and (known.sha256, known.size, known.mode) == (sha256, size, mode):
            return  # the same base: when and by what it was set stays as recorded
        self.files[path] = FileState(path, sha256, size, mode, when or now_iso(), synced_by)


def state_path(workspace: Path) -> Path:
    return Path(workspace) / STATE_DIR / STATE_FILE


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def new_deploy_id() -> str:
    """Sortable by time (UTC timestamp first), unique enough with a short random suffix."""
    now = _dt.datetime.now(_dt.timezone.utc)
    # Milliseconds keep a push and a quick rollback in the same second in order.
    return f"{now.strftime('%Y%m%dT%H%M%S')}.{now.microsecond // 1000:03d}Z-{secrets.token_hex(3)}"


@dataclass
class WorkspaceState:
    """Every host's record in one state file: the first host's, then the others by name."""

    first: State = field(default_factory=State)
    others: dict[str, State] = field(default_factory=dict)

    def record(self, host: str | None) -> State:
        """`host`'s record (a new empty one, naming the hosts that have records, when it has
        none); without a host, the first host's (one-host callers, version 2 behaviour)."""
        if host is None or self.first.host in (None, host):
            found = self.first
        elif host in self.others:
            found = self.others[host]
        else:
            found = State()
        names = [n for n in [self.first.host, *self.others] if n is not None]
        found.others = [n for n in names if n != (found.host or host)]
        return found

    def put(self, state: State) -> None:
        """Store a host's record where it belongs (the first slot when it is free or its own)."""
        if state.host is None or self.first.host in (None, state.host):
            self.first = state
        else:
            self.others[state.host] = state


def load_workspace_state(workspace: Path) -> WorkspaceState:
    """Every host's record in the workspace's state file; empty when nothing was pulled yet."""
    path = state_path(workspace)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return WorkspaceState()
    except NotADirectoryError:
        raise _not_a_folder(Path(workspace)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise StateError(f"cannot read the state file {path}: {err}") from None
    try:
        return _from_dict(json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise StateError(
            f"the state file {path} is corrupt: {err}",
            hint="fix or delete it; after deleting, `kerneldev pull --force` records a new base "
            "(deploy history is lost, host backups stay)",
        ) from None


def _not_a_folder(workspace: Path) -> KerneldevError:
    """The error for a workspace that is (or lies under) something other than a folder: the
    config's `workspace:` is wrong, not the state file."""
    for folder in (workspace, *workspace.parents):
        if folder.exists() and not folder.is_dir():
            where = "is a file" if folder == workspace else f"lies under a file, {folder}"
            return ConfigError(
                f"the workspace {workspace} (`workspace:` in hosts.yaml) {where}, not a folder",
                hint="point `workspace:` at a folder (the first pull creates it), or move the "
                "file out of the way",
            )
    return StateError(f"cannot read the state file {state_path(workspace)}: not a folder")


def load_state(workspace: Path, host: str | None = None) -> State:
    """`host`'s record in the workspace's state (without `host`: the first host's); an empty
    `State` when nothing was recorded for it yet."""
    return load_workspace_state(workspace).record(host)


def save_state(workspace: Path, state: State | WorkspaceState) -> None:
    """Write the state atomically: a reader sees the old or the new file, never half of one.
    A single `State` replaces the whole file with that one record."""
    whole = state if isinstance(state, WorkspaceState) else WorkspaceState(first=state)
    _write(workspace, _to_dict(whole))


def _write(workspace: Path, content: dict[str, Any]) -> None:
    path = state_path(workspace)
    data = json.dumps(content, indent=2, ensure_ascii=False) + "\n"
    try:
        write_bytes_atomic(path, data.encode("utf-8"))
    except OSError as err:
        raise StateError(f"cannot write the state file {path}: {err}") from None


def check_writable(workspace: Path, doing: str) -> None:
    """StateError unless this workspace's state can be written (its lock file opened for
    writing, a new file made beside the state file): checked before a push or rollback changes
    the host, so that a read-only workspace never deploys bytes it cannot then record."""
    folder = Path(workspace) / STATE_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.close(os.open(folder / STATE_LOCK, os.O_RDWR | os.O_CREAT, 0o644))
        # A file made and removed, as the state's atomic write will (access() says yes to
        # root on a root-squashed NFS mount, where the write then fails).
        probe = folder / f".writable-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as err:
        raise StateError(
            f"{doing} refused, nothing changed on the host: the workspace's state in {folder} "
            f"cannot be written ({err}), so the deploy could not be recorded",
            hint="make the workspace writable (or point `workspace:` at a writable folder), "
            "then run it again",
        ) from None


def update_state(
    workspace: Path, change: Callable[[State], None], host: str | None = None
) -> State:
    """Read-modify-write of `host`'s record (without `host`: the first host's) under the
    workspace's lock, the other hosts' records kept as they are; returns the new record."""
    folder = Path(workspace) / STATE_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / STATE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except NotADirectoryError:
        raise _not_a_folder(Path(workspace)) from None
    except OSError as err:
        raise StateError(f"cannot lock the state file in {folder}: {err}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for milliseconds: read, change, write
        whole = load_workspace_state(workspace)
        before = _to_dict(whole) if state_path(workspace).exists() else None
        state = whole.record(host)
        if state.host is None and host is not None:
            state.host = host
        change(state)
        whole.put(state)
        after = _to_dict(whole)
        if after != before:  # a no-op pull or push changes nothing: no rewrite, no fsync
            _write(workspace, after)
        return state
    finally:
        os.close(fd)  # closing releases the lock


def _record_dict(state: State) -> dict[str, Any]:
    return {
        "root": state.root,
        "files": {k: _as_dict(v) for k, v in sorted(state.files.items())},
        "deploys": [_as_dict(d) for d in state.deploys],
    }


_FIELDS: dict[type, tuple[str, ...]] = {}


def _as_dict(record: Any) -> dict[str, Any]:
    """`dataclasses.asdict` for the state's records (their fields hold scalars and lists of
    records), field by field: ~7 times faster, which a long deploy history pays on every save."""
    names = _FIELDS.get(type(record))
    if names is None:
        names = _FIELDS[type(record)] = tuple(f.name for f in dataclasses.fields(record))
    out = {}
    for name in names:
        value = getattr(record, name)
        if isinstance(value, list):
            value = [_as_dict(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[name] = value
    return out


def _to_dict(whole: WorkspaceState) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "host": whole.first.host,
        **_record_dict(whole.first),
        "hosts": {name: _record_dict(s) for name, s in sorted(whole.others.items())},
    }


def _record_from_dict(host: str | None, raw: Any) -> State:
    if not isinstance(raw, dict):
        raise ValueError(f"the record of host {host!r} is not an object")
    files_raw = raw.get("files", {})
    if not isinstance(files_raw, dict):
        raise ValueError("'files' is not an object")
    files = {k: FileState(**v) for k, v in files_raw.items()}
    deploys = [deploy_from_dict(d) for d in raw.get("deploys", [])]
    return State(host=host, root=raw.get("root"), files=files, deploys=deploys)


def _from_dict(raw: Any) -> WorkspaceState:
    if not isinstance(raw, dict):
        raise ValueError("top level is not an object")
    version = raw.get("version", 1)
    if version not in READABLE_VERSIONS:
        raise ValueError(f"unknown version {version!r} (this kerneldev reads 1 to {STATE_VERSION})")
    first = _record_from_dict(raw.get("host"), raw)
    others_raw = raw.get("hosts", {})  # absent before version 3
    if not isinstance(others_raw, dict):
        raise ValueError("'hosts' is not an object")
    others = {name: _record_from_dict(name, r) for name, r in others_raw.items()}
    return WorkspaceState(first=first, others=others)


def deploy_from_dict(raw: Any) -> DeployRecord:
    """A deploy record from its JSON form (state file or host history); raises ValueError,
    TypeError or KeyError when malformed."""
    d = dict(raw)
    d["files"] = [DeployedFile(**f) for f in d.get("files", [])]
    if "outcome" not in d:  # version 1
        d["outcome"] = "deployed" if d.get("complete", True) else "partial"
    return DeployRecord(**d)
