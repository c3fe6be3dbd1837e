"""pull, push and rollback: moving kernel files between the host and the workspace safely.

- pull: one `hash_files` round trip for all files; identical files are not transferred; a
  workspace file with unpushed edits is never overwritten without `force` (with `force` its
  bytes are kept under `<workspace>/.kerneldev/discarded/<time>/<path>`).
- push: uploads the files whose workspace content differs from live, each atomically, after
  copying the live bytes to `<root>/.kerneldev/backups/<deploy-id>/<path>` on the host. Files
  that drifted on the host (or conflict) are refused unless `force`. `dry_run` only plans.
- rollback: puts back the files of the last deploy from its host backups and records that as
  a deploy of its own, so a second rollback re-applies what the first one undid. A file the
  deploy created (it did not exist before) is removed by the rollback; its bytes are backed up
  first like any other, so the redo brings it back.

Nothing is half-done silently: if an upload fails midway, the deploy record lists exactly the
files that landed (marked incomplete) and the error names deployed and not-deployed files.
"""

from __future__ import annotations

import datetime as _dt
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev.atomic_file import write_bytes_atomic
from kerneldev.config import HostConfig
from kerneldev.drift import (
    CONFLICT,
    DRIFTED,
    EDITED,
    IN_SYNC,
    MISSING_LIVE,
    NOT_PULLED,
    classify,
)
from kerneldev.errors import (
    KerneldevError,
    NothingToRollBackError,
    PartialDeployError,
    RefusedError,
    TransferError,
)
from kerneldev.import_check import ImportCheckReport, check_deploy
from kerneldev.local_user import local_user
from kerneldev.service import ServiceHealth
from kerneldev.state import (
    STATE_DIR,
    DeployedFile,
    DeployRecord,
    State,
    load_state,
    new_deploy_id,
    now_iso,
    save_state,
)
from kerneldev.transport.base import RemoteFile, Transport
from kerneldev.workspace import (
    Snapshot,
    check_state_owner,
    glob_escape,
    resolve_paths,
    sha256_bytes,
    snapshot,
)

BACKUP_DIR = ".kerneldev/backups"  # under the host's root

ProgressCallback = Callable[[str], None]


# --- pull -------------------------------------------------------------------------------


@dataclass
class PulledFile:
    path: str
    action: str  # "pulled", "unchanged", "overwritten" (had local edits; --force)
    sha256: str
    size: int
    mode: int
    discarded: str | None = None  # where the overwritten workspace bytes were kept


@dataclass
class PullResult:
    host: str
    workspace: str
    files: list[PulledFile] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # configured/named but not on the host

    @property
    def transferred(self) -> int:
        return sum(1 for f in self.files if f.action != "unchanged")


def pull(
    transport: Transport,
    host: HostConfig,
    paths: list[str] | None = None,
    force: bool = False,
    on_progress: ProgressCallback | None = None,
) -> PullResult:
    """Copy live files into the workspace and record them as the new base."""
    selected = resolve_paths(host, paths)
    snap = snapshot(transport, host, selected)
    workspace = Path(host.workspace)
    result = PullResult(host=host.name, workspace=str(workspace))

    refused = []
    for path in snap.paths:
        live, local = snap.live.get(path), snap.local[path]
        if live is None or local is None or local.sha256 == live.sha256:
            continue
        base = snap.state.files.get(path)
        if base is None or local.sha256 != base.sha256:
            refused.append(path)
    if refused and not force:
        raise RefusedError(
            "not pulled, the workspace has unpushed edits in: " + ", ".join(refused),
            hint="push them first, see them with `kerneldev diff --patch`, or discard them with "
            "`kerneldev pull --force` (their bytes are kept under .kerneldev/discarded/)",
            report={"host": host.name, "workspace": str(workspace), "refused": refused},
        )

    state = snap.state
    state.host, state.root = host.name, host.root
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    try:
        for path in snap.paths:
            live, local = snap.live.get(path), snap.local[path]
            if live is None:
                result.missing.append(path)
                continue
            target = workspace / path
            if local is not None and local.sha256 == live.sha256:
                if local.mode != live.mode:
                    try:
                        os.chmod(target, live.mode)
                    except OSError as err:
                        raise TransferError(f"cannot set the mode of {target}: {err}") from None
                state.set_base(path, live.sha256, live.size, live.mode, "pull")
                result.files.append(
                    PulledFile(path, "unchanged", live.sha256, live.size, live.mode)
                )
                continue
            if on_progress:
                on_progress(path)
            data = transport.read_bytes(posixpath.join(host.root, path))
            sha = sha256_bytes(data)  # what we got, even if live changed since the hash
            discarded = None
            if path in refused:
                keep = workspace / STATE_DIR / "discarded" / stamp / path
                _write_local_atomic(keep, target.read_bytes(), local.mode)
                discarded = str(keep)
            _write_local_atomic(target, data, live.mode)
            state.set_base(path, sha, len(data), live.mode, "pull")
            action = "overwritten" if discarded else "pulled"
            result.files.append(PulledFile(path, action, sha, len(data), live.mode, discarded))
    finally:
        # What was pulled before a failure stays recorded; the rest is pulled next time.
        save_state(workspace, state)
    return result


def _write_local_atomic(path: Path, data: bytes, mode: int) -> None:
    try:
        write_bytes_atomic(path, data, mode)
    except OSError as err:
        raise TransferError(f"cannot write {path}: {err}") from None


# --- push -------------------------------------------------------------------------------


@dataclass
class PlannedFile:
    path: str
    status: str  # drift status before the push
    action: str  # "upload", "create", "skip", "refused"
    old_sha256: str | None
    new_sha256: str | None
    reason: str | None = None


@dataclass
class PushResult:
    host: str
    dry_run: bool
    deploy_id: str | None  # None when nothing was uploaded
    files: list[PlannedFile] = field(default_factory=list)
    deployed: list[str] = field(default_factory=list)
    health: ServiceHealth | None = None  # when --restart ran (filled by the CLI)
    import_check: ImportCheckReport | None = None  # None: not run (dry run, --no-import-check)

    @property
    def uploads(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action in ("upload", "create")]

    @property
    def refused(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action == "refused"]


def _plan(
    transport: Transport, host: HostConfig, paths: list[str] | None, force: bool
) -> tuple[PushResult, Snapshot]:
    """Decide per file what a push would do (the dry run's answer); changes nothing."""
    selected = resolve_paths(host, paths)
    snap = snapshot(transport, host, selected)
    plan = PushResult(host=host.name, dry_run=True, deploy_id=None)
    for path in snap.paths:
        live, local = snap.live.get(path), snap.local[path]
        base = snap.state.files.get(path)
        status, _ = classify(
            live.sha256 if live else None,
            local.sha256 if local else None,
            base.sha256 if base else None,
        )
        old = live.sha256 if live else None
        new = local.sha256 if local else None
        action, reason = "skip", None
        if status == IN_SYNC:
            reason = "live already has these bytes"
        elif status == NOT_PULLED:
            reason = "not in the workspace"
        elif status == EDITED:
            action = "upload"
        elif status in (DRIFTED, CONFLICT):
            if force:
                action, reason = "upload", f"{status}; overwritten because of --force"
            else:
                action = "refused"
                reason = (
                    "live changed since the last pull/push"
                    if status == DRIFTED
                    else "both live and the workspace changed"
                )
        elif status == MISSING_LIVE:
            if local is None:
                reason = "neither on the host nor in the workspace"
            elif base is None or force:
                action = "create"  # a new file, or a file deleted on the host and --force
            else:
                action, reason = "refused", "deleted on the host since the last pull/push"
        plan.files.append(PlannedFile(path, status, action, old, new, reason))
    return plan, snap


def push(
    transport: Transport,
    host: HostConfig,
    paths: list[str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    on_progress: ProgressCallback | None = None,
    import_check: bool = False,
    create_root: bool = False,
) -> PushResult:
    """Upload workspace files that differ from live, with host backups and a deploy record.

    With `dry_run` the plan is returned and nothing changes anywhere (host, workspace, state).
    `import_check` (the CLI's default) scans the live tree's imports before the upload and
    imports the pushed modules after it, rolling back on failure (kerneldev/import_check.py).
    Refused files (drifted/conflict without `force`) raise `RefusedError` before any upload;
    a dry run returns them in the plan instead, so the user sees the whole picture.
    A `root` that does not exist on the host is refused unless `create_root`: a typo in it
    would otherwise create the whole path there and deploy into it.
    """
    if not create_root and not transport.exists(host.root):
        raise RefusedError(
            f"push refused: the root {host.root} does not exist on host '{host.name}'",
            hint=f"check `root:` of host '{host.name}' in the config (a typo?); to create it "
            "and push into it, run `kerneldev push --create-root`",
        )
    plan, snap = _plan(transport, host, paths, force)
    if dry_run:
        return plan
    refused = plan.refused
    if refused:
        raise RefusedError(
            "push refused, live changed on the host since the last pull/push: "
            + ", ".join(f"{f.path} ({f.status})" for f in refused),
            hint="see the changes with `kerneldev diff --patch`; pull them and merge your edits, "
            "or overwrite with `kerneldev push --force`",
            report=plan,
        )
    state: State = snap.state
    state.host, state.root = host.name, host.root
    plan.dry_run = False
    uploads = plan.uploads
    # Files that already match live get their base refreshed; a push is a sync point.
    for f in plan.files:
        live = snap.live.get(f.path)
        if f.status == IN_SYNC and live is not None:
            state.set_base(f.path, live.sha256, live.size, live.mode, "push")
    if not uploads:
        save_state(host.workspace, state)
        return plan

    plan.deploy_id = new_deploy_id()
    record = DeployRecord(
        id=plan.deploy_id, time=now_iso(), host=host.name, user=local_user(), kind="push"
    )
    local_modes = {p: (snap.local[p].mode if snap.local[p] else None) for p in snap.paths}

    def one(f: PlannedFile) -> DeployedFile:
        data = (Path(host.workspace) / f.path).read_bytes()
        new_sha = sha256_bytes(data)
        live = snap.live.get(f.path)
        # An existing live file keeps its mode; a created one gets the workspace file's.
        mode = None if live is not None else local_modes.get(f.path)
        deployed = _replace_on_host(
            transport, host, plan.deploy_id, f.path, data, live=live, mode=mode, force=force
        )
        state.set_base(f.path, new_sha, len(data), deployed.new_mode or 0, "push")
        return deployed

    new = {f.path: (Path(host.workspace) / f.path).read_bytes() for f in uploads}
    with check_deploy(transport, host, plan, new, import_check, lambda: _undo(transport, host)):
        _run_deploy(transport, host, state, record, uploads, one, on_progress, plan.deployed)
    return plan


def _undo(transport: Transport, host: HostConfig) -> str:
    """Roll back the deploy just made (its files failed to import); returns the rollback's id."""
    return rollback(transport, host, force=True, import_check=False).deploy_id


def _replace_on_host(
    transport: Transport,
    host: HostConfig,
    deploy_id: str,
    path: str,
    data: bytes | None,
    *,
    live: RemoteFile | None,
    mode: int | None,
    force: bool,
) -> DeployedFile:
    """Back up the live file under the deploy's folder, then write `data` atomically (or remove
    the live file when `data` is None). `live` is the file as hashed when the deploy was
    planned; if the host changed it since, the file is refused (unless `force`)."""
    live_path = posixpath.join(host.root, path)
    old: bytes | None = None
    if live is not None or transport.exists(live_path):
        try:
            old = transport.read_bytes(live_path)
        except TransferError:
            if live is not None:
                raise
    old_sha = sha256_bytes(old) if old is not None else None
    if old_sha != (live.sha256 if live else None) and not force:
        raise RefusedError(
            f"{path} changed on the host while deploying; it was left as it is",
            hint="run `kerneldev diff` and try again",
        )
    old_mode = live.mode if live is not None else None
    backup_rel = None
    if old is not None:
        backup_rel = posixpath.join(BACKUP_DIR, deploy_id, path)
        transport.write_atomic(posixpath.join(host.root, backup_rel), old, mode=old_mode)
    if data is None:
        transport.remove(live_path)
        return DeployedFile(path, old_sha, None, old_mode, None, backup_rel)
    # mode None keeps the replaced file's mode (write_atomic's rule).
    transport.write_atomic(live_path, data, mode=mode)
    new_mode = mode if mode is not None else old_mode
    return DeployedFile(path, old_sha, sha256_bytes(data), old_mode, new_mode, backup_rel)


def _run_deploy(
    transport: Transport,
    host: HostConfig,
    state: State,
    record: DeployRecord,
    todo: list,
    one: Callable,
    on_progress: ProgressCallback | None,
    deployed_paths: list[str],
) -> None:
    """Apply `one` to every item, recording each landed file; on failure record what landed
    and raise an error that names deployed and not-deployed files."""
    try:
        for item in todo:
            if on_progress:
                on_progress(item.path)
            record.files.append(one(item))
            deployed_paths.append(item.path)
    except BaseException as err:
        record.complete = False
        if record.files:
            state.deploys.append(record)
        save_state(host.workspace, state)
        if not isinstance(err, (KerneldevError, OSError)):
            raise
        done = [f.path for f in record.files]
        left = [i.path for i in todo if i.path not in done]
        reason = err.message if isinstance(err, KerneldevError) else str(err)
        if not done:
            raise
        raise PartialDeployError(
            f"{record.kind} {record.id} stopped midway: {reason}. "
            f"Deployed: {', '.join(done)}. Not deployed: {', '.join(left)}",
            done,
            left,
            hint="the deploy record lists what landed; `kerneldev rollback` undoes it, or fix "
            "the cause and push again",
        ) from None
    state.deploys.append(record)
    save_state(host.workspace, state)


# --- rollback ---------------------------------------------------------------------------


@dataclass
class RollbackResult:
    host: str
    deploy_id: str  # the rollback's own deploy id
    rolls_back: str  # the deploy it undid
    files: list[DeployedFile] = field(default_factory=list)
    health: ServiceHealth | None = None  # when --restart ran (filled by the CLI)
    import_check: ImportCheckReport | None = None  # None: not run (--no-import-check)


@dataclass
class _Restore:
    path: str
    live: RemoteFile | None  # what the undone deploy left on the host
    data: bytes | None  # bytes to put back; None = remove the file
    mode: int | None


def rollback(
    transport: Transport,
    host: HostConfig,
    force: bool = False,
    on_progress: ProgressCallback | None = None,
    import_check: bool = False,
) -> RollbackResult:
    """Restore the files of the last deploy from its host backups, as a new deploy."""
    state = load_state(host.workspace)
    check_state_owner(state, host)
    if not state.deploys:
        raise NothingToRollBackError(
            f"nothing to roll back: no deploy is recorded in {host.workspace}",
            hint="rollback undoes the last `kerneldev push` made from this workspace",
        )
    last = state.deploys[-1]
    if not last.files:
        raise NothingToRollBackError(
            f"the last deploy {last.id} changed no files; nothing to roll back"
        )

    paths = [f.path for f in last.files]
    live_files, _ = transport.hash_files(host.root, [glob_escape(p) for p in paths])
    live = {f.path: f for f in live_files}
    changed = [
        f.path
        for f in last.files
        if (live[f.path].sha256 if f.path in live else None) != f.new_sha256
    ]
    if changed and not force:
        raise RefusedError(
            f"rollback refused, changed on the host since deploy {last.id}: " + ", ".join(changed),
            hint="see `kerneldev diff`; `kerneldev rollback --force` restores the backups anyway",
        )

    # Read every backup before touching anything, so a missing backup stops us early.
    todo = []
    for f in last.files:
        data = None
        if f.old_sha256 is not None:
            if f.backup is None:
                raise TransferError(f"deploy {last.id} recorded no backup for {f.path}")
            data = transport.read_bytes(posixpath.join(host.root, f.backup))
            if sha256_bytes(data) != f.old_sha256:
                raise TransferError(
                    f"the backup of {f.path} on the host ({f.backup}) does not match its "
                    "recorded sha256; nothing was restored"
                )
        todo.append(_Restore(f.path, live.get(f.path), data, f.old_mode))

    record = DeployRecord(
        id=new_deploy_id(),
        time=now_iso(),
        host=host.name,
        user=local_user(),
        kind="rollback",
        rolls_back=last.id,
    )
    state.host, state.root = host.name, host.root
    result = RollbackResult(host=host.name, deploy_id=record.id, rolls_back=last.id)

    def one(r: _Restore) -> DeployedFile:
        deployed = _replace_on_host(
            transport, host, record.id, r.path, r.data, live=r.live, mode=r.mode, force=force
        )
        if r.data is None:
            state.files.pop(r.path, None)
        else:
            mode = deployed.new_mode if deployed.new_mode is not None else 0o644
            state.set_base(r.path, sha256_bytes(r.data), len(r.data), mode, "rollback")
        return deployed

    new = {r.path: r.data for r in todo}
    with check_deploy(transport, host, result, new, import_check, None):
        _run_deploy(transport, host, state, record, todo, one, on_progress, [])
        result.files = record.files
    return result
