"""What kerneldev remembers about a workspace: `<workspace>/.kerneldev/state.json`.

Per tracked file, the "base": sha256, size and mode of the live file at the last pull or push
(what live was when workspace and live were last known to agree). Drift detection compares the
workspace and live against it. Also the list of deploys (push and rollback), each naming the
files it replaced, their old and new sha256 and where the old bytes were backed up on the host.

The file is written atomically (temporary file + `os.replace`), so a crash never leaves half a
state behind. A file that cannot be read or parsed is a `StateError` naming it, never a
traceback.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.errors import StateError

STATE_DIR = ".kerneldev"
STATE_FILE = "state.json"
STATE_VERSION = 1


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


@dataclass
class State:
    host: str | None = None
    root: str | None = None
    files: dict[str, FileState] = field(default_factory=dict)
    deploys: list[DeployRecord] = field(default_factory=list)

    def set_base(
        self, path: str, sha256: str, size: int, mode: int, synced_by: str, when: str | None = None
    ) -> None:
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


def load_state(workspace: Path) -> State:
    """The workspace's state; an empty `State` when nothing was pulled yet."""
    path = state_path(workspace)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return State()
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


def save_state(workspace: Path, state: State) -> None:
    """Write the state atomically: a reader sees the old or the new file, never half of one."""
    path = state_path(workspace)
    data = json.dumps(_to_dict(state), indent=2, ensure_ascii=False) + "\n"
    try:
        write_bytes_atomic(path, data.encode("utf-8"))
    except OSError as err:
        raise StateError(f"cannot write the state file {path}: {err}") from None


def _to_dict(state: State) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "host": state.host,
        "root": state.root,
        "files": {k: dataclasses.asdict(v) for k, v in sorted(state.files.items())},
        "deploys": [dataclasses.asdict(d) for d in state.deploys],
    }


def _from_dict(raw: Any) -> State:
    if not isinstance(raw, dict):
        raise ValueError("top level is not an object")
    version = raw.get("version", STATE_VERSION)
    if version != STATE_VERSION:
        raise ValueError(f"unknown version {version!r} (this kerneldev reads {STATE_VERSION})")
    files_raw = raw.get("files", {})
    if not isinstance(files_raw, dict):
        raise ValueError("'files' is not an object")
    files = {k: FileState(**v) for k, v in files_raw.items()}
    deploys = []
    for d in raw.get("deploys", []):
        d = dict(d)
        d["files"] = [DeployedFile(**f) for f in d.get("files", [])]
        deploys.append(DeployRecord(**d))
    return State(host=raw.get("host"), root=raw.get("root"), files=files, deploys=deploys)
