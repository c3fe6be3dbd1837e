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

Nothing is half-done silently: if an upload fails midway, is interrupted (Ctrl-C, SIGTERM) or
loses its connection, the deploy record lists exactly the files that landed (marked incomplete)
and the error names deployed and not-deployed files. Each file is streamed to a temporary file
next to its target and renamed over it only after a compare-and-swap check (live must still
be what the plan saw), so a target is always its old or its new version. Backups are copies
made on the host. push and rollback expect the caller to hold the host lock
(`host_lock.HostLock`); they clean leftovers of interrupted runs and append to the host's
shared history (`history.py`). The deploy's stages from the backups to the record (and the
typed data they pass) are in `push_pipeline.py`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import os
import posixpath
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev import interrupt
from kerneldev.atomic_file import SyncedRenames, sync_folders, write_stream_atomic, write_temp
from kerneldev.config import HostConfig
from kerneldev.errors import (
    FileSetError,
    NothingToRollBackError,
    PartialDeployError,  # noqa: F401 - raised by push_pipeline.run_deploy, long named here
    RefusedError,
    TransferError,
    UsageError,
)
from kerneldev.hosts.transport.base import (
    ByteCallback,
    Transport,
)
from kerneldev.hostside.hashfiles import real_path
from kerneldev.local_user import local_user
from kerneldev.loop import history, push_pipeline, settle
from kerneldev.loop.drift import (
    CONFLICT,
    DRIFTED,
    EDITED,
    IN_SYNC,
    MISSING_LIVE,
    NOT_PULLED,
    classify,
)
from kerneldev.loop.import_check import ImportCheckReport, check_deploy
from kerneldev.loop.lock import HostLock, holding
from kerneldev.loop.push_pipeline import BaseUpdate, Deploy, DeployStep, ProgressCallback
from kerneldev.loop.state import (
    STATE_DIR,
    DeployedFile,
    DeployRecord,
    State,
    check_writable,
    load_state,
    new_deploy_id,
    now_iso,
    update_state,
)
from kerneldev.loop.workspace import (
    Snapshot,
    check_state_owner,
    glob_escape,
    resolve_paths,
    snapshot,
)
from kerneldev.paths import DISCARDED_DIR
from kerneldev.printable import printable, printable_list
from kerneldev.service.restart import ServiceHealth

BACKUP_DIR = history.BACKUP_DIR  # under the host's root


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
    # Never written: a symlink in the workspace leads them outside it (path -> where).
    outside = _leading_outside(workspace, [p for p in snap.paths if p in snap.live])

    refused = []
    for path in snap.paths:
        live, local = snap.live.get(path), snap.local[path]
        if path in outside:
            continue
        if live is None or local is None or local.sha256 == live.sha256:
            continue
        base = snap.state.files.get(path)
        if base is None or local.sha256 != base.sha256:
            refused.append(path)
    if refused and not force:
        raise RefusedError(
            "not pulled, the workspace has unpushed edits in: " + printable_list(refused),
            hint="push them first, see them with `kerneldev diff --patch`, or discard them with "
            f"`kerneldev pull --force` (their bytes are kept under {DISCARDED_DIR}/)",
            report={"host": host.name, "workspace": str(workspace), "refused": refused},
        )

    bases: list[BaseUpdate] = []
    touched: list[str] = []  # workspace files written or chmodded: settled after a kept pull
    # Gone from the host and from the workspace: both sides agree, so the base is forgotten
    # (else the file stays `missing-live`, exit 1, for ever after it was deleted everywhere).
    gone = [p for p in snap.paths if p not in snap.live and snap.local[p] is None]
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    # Every file to transfer comes down in one transfer, in this order (one stream, or SFTP file
    # by file: the transport picks what is cheaper on this host).
    fetch = [
        p
        for p in snap.paths
        if p in snap.live
        and p not in outside
        and (snap.local[p] is None or snap.local[p].sha256 != snap.live[p].sha256)
    ]
    stream = transport.stream_files([posixpath.join(host.root, p) for p in fetch])
    # The folders of the files landed: their renames made durable once each, at the end (each
    # file's bytes are on disk before its rename, as always; 100 small files: -15 to -25 ms).
    folders: set[Path] = set()
    # Several files: each one's sync and rename in `renames`' threads while the next one
    # streams in (their fsyncs overlap); its base is recorded once it is renamed.
    renames = SyncedRenames() if len(fetch) > 1 else None
    landing: dict[str, BaseUpdate] = {}
    try:
        for path in snap.paths:
            live, local = snap.live.get(path), snap.local[path]
            if live is None:
                result.missing.append(path)
                continue
            if path in outside:
                continue  # never written through the link; reported below
            target = workspace / path
            if local is not None and local.sha256 == live.sha256:
                if local.mode != live.mode:
                    try:
                        os.chmod(target, live.mode)
                    except OSError as err:
                        raise TransferError(f"cannot set the mode of {target}: {err}") from None
                    touched.append(path)
                bases.append(BaseUpdate(path, live.sha256, live.size, live.mode))
                result.files.append(
                    PulledFile(path, "unchanged", live.sha256, live.size, live.mode)
                )
                continue
            if on_progress:
                on_progress(path)
            interrupt.check()
            _, chunks = next(stream)
            discarded = None
            if path in refused:
                keep = workspace / STATE_DIR / "discarded" / stamp / path
                _copy_local_atomic(target, keep, local.mode)
                discarded = str(keep)
            # Streamed to a temporary file in chunks (memory stays flat, Ctrl-C is honoured
            # between chunks), renamed over the workspace file only when complete.
            reader = _ChunkReader(chunks)
            _write_local_stream(target, reader, live.mode, folders, renames, path)
            touched.append(path)
            sha = reader.hexdigest()  # what we got, even if live changed since the hash
            base = BaseUpdate(path, sha, reader.size, live.mode)
            if renames is None:
                bases.append(base)
            else:
                landing[path] = base
            action = "overwritten" if discarded else "pulled"
            result.files.append(PulledFile(path, action, sha, reader.size, live.mode, discarded))
    finally:
        stream.close()  # an early stop (error, Ctrl-C) ends the transfer on the host too
        failed = None
        if renames is not None:
            with interrupt.shield():  # every file handed over is renamed (or dropped) first
                renamed, failed = renames.wait()
            bases.extend(landing[path] for path in renamed)

        # What was pulled before a failure or Ctrl-C stays recorded; the rest is pulled next
        # time. Read-modify-write under the state lock: another terminal's records survive.
        def change(state: State) -> None:
            state.host, state.root = host.name, host.root
            for base in bases:
                state.set_base(base.path, base.sha256, base.size, base.mode, "pull")
            for path in gone:
                state.files.pop(path, None)

        with interrupt.shield():
            sync_folders(folders)
            update_state(workspace, change, host.name)
            sizes = {base.path: base.size for base in bases}
            if transport.settles_writes and settle.worth_settling(touched, sizes):
                settle.settle_workspace_later(workspace, touched)
    if failed is not None:
        target, err = failed
        raise TransferError(f"cannot write {target}: {err.strerror or err}") from None
    if outside:
        pulled = sum(1 for f in result.files if f.action != "unchanged")
        raise RefusedError(
            "not pulled, a symlink in the workspace leads outside it: "
            + "; ".join(f"{printable(p)} -> {printable(t)}" for p, t in outside.items())
            + (f" ({pulled} other file(s) pulled)" if pulled else ""),
            hint=f"kerneldev writes only inside the workspace ({workspace}); remove the symlink "
            "or point it inside the workspace, then pull again",
            report={**dataclasses.asdict(result), "outside": outside},  # --json: what was pulled
        )
    return result


def _leading_outside(workspace: Path, paths: list[str]) -> dict[str, str]:
    """The paths whose workspace file, through a symlink (a folder or the file itself), lies
    outside the workspace, with where it leads. Real paths are compared, so a workspace that
    is itself a link (or lies under one) is fine."""
    root = os.path.realpath(workspace)
    inside = root.rstrip(os.sep) + os.sep
    outside = {}
    real_parents: dict[str, str] = {}  # one realpath per folder: a file's own name rarely links
    for path in paths:
        real, _ = real_path(os.path.join(workspace, path), real_parents)
        if real != root and not real.startswith(inside):
            outside[path] = real
    return outside


class _ChunkReader:
    """A binary file over an iterator of byte chunks (a transport's `stream_files`), hashing
    and counting what is read."""

    def __init__(self, chunks) -> None:
        self.chunks = iter(chunks)
        self.pending = b""
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        while not self.pending:
            chunk = next(self.chunks, None)
            if chunk is None:
                return b""
            self.pending = chunk
        if n < 0 or n >= len(self.pending):
            data, self.pending = self.pending, b""
        else:
            data, self.pending = self.pending[:n], self.pending[n:]
        self.digest.update(data)
        self.size += len(data)
        return data

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _write_local_stream(
    path: Path,
    source,
    mode: int,
    written: set[Path],
    renames: SyncedRenames | None = None,
    key: str | None = None,
) -> None:
    """Land one pulled file; its folder joins `written`, made durable once at the end. With
    `renames`, its bytes are written here and its sync and rename handed to it (as `key`)."""
    try:
        if renames is None:
            write_stream_atomic(
                path, source, mode, on_chunk=lambda _n: interrupt.check(), sync_folder=False
            )
        else:
            fd, tmp = write_temp(path, source, mode, on_chunk=lambda _n: interrupt.check())
            renames.add(fd, tmp, path, key)
        written.add(path.parent)
    except OSError as err:
        raise TransferError(f"cannot write {path}: {err}") from None


def _copy_local_atomic(source: Path, path: Path, mode: int) -> None:
    try:
        with open(source, "rb") as f:
            write_stream_atomic(path, f, mode)
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
    notes: list[str] = field(default_factory=list)  # leftovers cleaned, backups pruned, ...
    auto_rollback: RollbackResult | None = None  # when --restart found the service unhealthy
    import_check: ImportCheckReport | None = None  # None: not run (dry run, --no-import-check)

    @property
    def uploads(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action in ("upload", "create")]

    @property
    def refused(self) -> list[PlannedFile]:
        return [f for f in self.files if f.action == "refused"]


def plan_push(
    transport: Transport, host: HostConfig, paths: list[str] | None = None, force: bool = False
) -> PushResult:
    """Decide per file what a push would do; changes nothing."""
    return _plan(transport, host, paths, force)[0]


def _missing_root(host: HostConfig) -> RefusedError:
    return RefusedError(
        f"push refused: the root {host.root} does not exist on host '{host.name}'",
        hint=f"check `root:` of host '{host.name}' in the config (a typo?); to create it "
        "and push into it, run `kerneldev push --create-root`",
    )


def _plan(
    transport: Transport,
    host: HostConfig,
    paths: list[str] | None,
    force: bool,
    leftovers: bool = False,
    lock: HostLock | None = None,
    release_lock: bool = False,
    remember: bool = True,
) -> tuple[PushResult, Snapshot]:
    selected = resolve_paths(host, paths)
    request = None
    if lock is not None:

        def request(local: dict[str, str]) -> dict:
            return lock.scan_request(local if release_lock else None)

    snap = snapshot(transport, host, selected, leftovers=leftovers, lock=request, remember=remember)
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
    # New files, and files deleted on the host since the last sync (refused without --force).
    creates = [f for f in plan.files if f.status == MISSING_LIVE and f.new_sha256 is not None]
    if creates:
        for i in out_of_root(transport, host, [f.path for f in creates]):
            creates[i].action, creates[i].reason = "refused", OUT_OF_ROOT
    return plan, snap


# Why a planned new file is refused even with --force (`PlannedFile.reason`).
OUT_OF_ROOT = "on the host it leads out of root (a symlink) or is not a regular file"


def out_of_root(transport: Transport, host: HostConfig, paths: list[str]) -> list[int]:
    """Indexes of `paths` (planned as new files) that something on the host already occupies,
    or whose nearest existing folder is outside root. The scan sees only regular files inside
    root, so a symlink out of it (or through a symlinked folder) looks absent; writing the
    "new" file would land outside root, through the link. One command, only for new files
    (push's plan; doctor's `files` check for the literal entries the scan did not find)."""
    lines = [f"cd -- {shlex.quote(host.root)} || exit 0", 'r=$(pwd -P); [ "$r" = / ] && r=']
    for i, path in enumerate(paths):
        q = shlex.quote(path)
        lines.append(
            f"if [ -e {q} ] || [ -L {q} ]; then echo {i}; else d=$(dirname -- {q}); "
            'while [ ! -d "$d" ]; do d=$(dirname -- "$d"); done; '
            f'case "$(cd -- "$d" && pwd -P)/" in "$r"/*) ;; *) echo {i};; esac; fi'
        )
    result = transport.run("sh -s", stdin=("\n".join(lines) + "\n").encode("utf-8"))
    return [int(w) for w in result.stdout.split() if w.isdigit() and int(w) < len(paths)]


def push(
    transport: Transport,
    host: HostConfig,
    paths: list[str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    on_progress: ProgressCallback | None = None,
    on_bytes: ByteCallback | None = None,
    import_check: bool = False,
    create_root: bool = False,
    lock: HostLock | None = None,
    release_lock: bool = False,
    on_plan: Callable[[PushResult], None] | None = None,
) -> PushResult:
    """Upload workspace files that differ from live, with host backups and a deploy record.

    Call it holding the host lock (`host_lock.HostLock`) so the plan is made inside it. With
    `dry_run` the plan is returned and nothing changes anywhere (host, workspace, state).
    Refused files (drifted/conflict without `force`) raise `RefusedError` before any upload;
    a dry run returns them in the plan instead, so the user sees the whole picture.
    A `root` that does not exist on the host is refused unless `create_root`: a typo in it
    would otherwise create the whole path there and deploy into it.
    `on_progress(path)` is called before each file, `on_bytes(n)` as bytes go out.
    `import_check` (the CLI's default) scans the live tree's imports before the upload and
    imports the pushed modules after it, rolling back on failure (kerneldev/loop/import_check.py).
    `lock`: instead of holding the lock already, the caller may hand it over not yet taken:
    push takes it in its first remote command (the scan); `release_lock` (nothing after the
    push needs the lock: no restart) lets push release it in its last one - in the scan itself
    when nothing can change, in the history append when the import check is off. A no-op push
    is then one remote command, a cold one three (scan, backups, record).
    `on_plan(plan)` is called once with the plan the push carries out (made under the lock,
    after any wait for it), before anything changes: what a progress bar should count.
    """
    # One remote command plans (hashes), sees whether root exists and finds leftovers, and
    # takes the host lock first when it was handed over.
    taking = lock is not None and not lock.held and not dry_run
    try:
        if taking:
            plan, snap = _plan(transport, host, paths, force, True, lock, release_lock)
            if not lock.took(snap.lock):  # busy: wait for it (or take over / break it)
                lock.acquire()
                plan, snap = _plan(transport, host, paths, force, leftovers=True)
            elif not lock.held and (plan.uploads or plan.refused or snap.leftovers):
                # The host dropped the lock (its view: nothing to change) but this plan has
                # work after all: never change anything unlocked; take it and plan again.
                lock.acquire()
                plan, snap = _plan(transport, host, paths, force, leftovers=True)
            plan.notes += lock.notes
        else:
            # A dry run writes nothing, not even the workspace's sums cache.
            plan, snap = _plan(transport, host, paths, force, leftovers=True, remember=not dry_run)
    except FileSetError:
        if not create_root and not transport.exists(host.root):
            raise _missing_root(host) from None
        raise
    if not create_root and not snap.root_exists:
        raise _missing_root(host)
    if dry_run:
        return plan
    refused = plan.refused
    outside = [f.path for f in refused if f.reason == OUT_OF_ROOT]
    if outside:
        raise RefusedError(
            f"push refused, nothing written: {', '.join(outside)} {OUT_OF_ROOT}; kerneldev "
            "never writes outside root",
            hint="on the host, make it a regular file inside root (or remove the link), or "
            "drop it from `files:`",
            report=plan,
        )
    if refused:
        raise RefusedError(
            "push refused, live changed on the host since the last pull/push: "
            + ", ".join(f"{printable(f.path)} ({f.status})" for f in refused),
            hint="see the changes with `kerneldev diff --patch`; pull them and merge your edits, "
            "or overwrite with `kerneldev push --force`",
            report=plan,
        )
    plan.dry_run = False
    check_writable(Path(host.workspace), "push")
    if on_plan is not None:
        on_plan(plan)
    plan.notes += push_pipeline.clean_leftovers(transport, host, snap.leftovers)
    uploads = plan.uploads
    # Files that already match live get their base refreshed; a push is a sync point.
    in_sync = [snap.live[f.path] for f in plan.files if f.status == IN_SYNC and f.path in snap.live]
    bases = [BaseUpdate(f.path, f.sha256, f.size, f.mode) for f in in_sync]
    if not uploads:
        push_pipeline.save_bases(host, bases, None)
        return plan

    plan.deploy_id = new_deploy_id()
    record = DeployRecord(
        id=plan.deploy_id, time=now_iso(), host=host.name, user=local_user(), kind="push"
    )
    steps = []
    for f in uploads:
        live = snap.live.get(f.path)
        local = snap.local[f.path]
        # An existing live file keeps its mode; a created one gets the workspace file's.
        mode = None if live is not None else (local.mode if local else None)
        steps.append(
            DeployStep(
                f.path,
                live.sha256 if live else None,
                live.mode if live else None,
                mode,
                new_sha256=local.sha256 if local else None,
            )
        )
    deploy = Deploy(host, record, steps, force=force, bases=bases)
    land = push_pipeline.upload_from_workspace(transport, on_progress, on_bytes)
    new = _python_sources(Path(host.workspace), [f.path for f in uploads], import_check)
    # The lock may go with the record's append when nothing follows it (no import check: its
    # failure rolls back, under the lock).
    release = lock if release_lock and lock is not None and not import_check else None
    # Leftovers settled above may have appended to the history since the scan read it.
    past = _history_seen(snap) if not snap.leftovers else None
    # The lock the deploy's host steps check is still ours (handed over, or the caller's).
    held = lock if lock is not None and lock.held else holding(transport, host.root)
    with check_deploy(transport, host, plan, new, import_check, lambda: _undo(transport, host)):
        try:
            push_pipeline.run_deploy(transport, deploy, land, release=release, past=past, lock=held)
        finally:
            plan.deployed = deploy.landed
    if settle.worth_settling(deploy.landed, {base.path: base.size for base in deploy.bases}):
        transport.settle_live(host.root, deploy.landed)
    return plan


def _history_seen(snap: Snapshot) -> history.History | None:
    """The host's history as the scan read it under the lock (None: it did not)."""
    held = snap.lock or {}
    if "history" not in held:
        return None
    return history.parse_history(held["history"] or "")


def _python_sources(folder: Path, paths: list[str], wanted: bool) -> dict[str, bytes | None]:
    """The pushed Python modules' bytes for the import check (only .py files, which are small;
    other files stream and are never held in memory)."""
    if not wanted:
        return {}
    return {p: (folder / p).read_bytes() for p in paths if p.endswith(".py")}


def _undo(transport: Transport, host: HostConfig) -> str:
    """Roll back the deploy just made (its files failed to import); returns the rollback's id."""
    return rollback(transport, host, force=True, import_check=False).deploy_id


# --- rollback ---------------------------------------------------------------------------


@dataclass
class RestoredFile:
    path: str
    live_sha256: str | None  # what is live now (expected to be replaced)
    restore_sha256: str | None  # what goes back (None: the file is removed)
    backup: str | None  # root-relative backup the bytes come from


@dataclass
class RollbackResult:
    host: str
    deploy_id: str | None  # the rollback's own deploy id (None for a dry run)
    rolls_back: str  # the deploy it undid (or, with --to, the deploy it returns to)
    files: list[DeployedFile] = field(default_factory=list)
    health: ServiceHealth | None = None  # when --restart ran (filled by the CLI)
    dry_run: bool = False
    plan: list[RestoredFile] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    import_check: ImportCheckReport | None = None  # None: not run (--no-import-check)


def deploy_history(transport: Transport, host: HostConfig) -> list[DeployRecord]:
    """Every deploy known: the host's shared history plus this workspace's records (a deploy
    cut off before it reached the host's history), in time order."""
    records = {r.id: r for r in load_state(host.workspace, host.name).deploys}
    records.update({r.id: r for r in history.load_history(transport, host.root).records})
    return [records[k] for k in sorted(records)]


def _restore_plan(
    records: list[DeployRecord], to: str | None
) -> tuple[DeployRecord, list[RestoredFile], dict[str, str | None]]:
    """(the deploy named in messages, what to restore, the sha256 expected live per path)."""
    with_files = [r for r in records if r.files]
    if not with_files:
        raise NothingToRollBackError(
            "nothing to roll back: no deploy is recorded for this host",
            hint="rollback undoes the last `kerneldev push` (anyone's, from the host's history)",
        )
    expected: dict[str, str | None] = {}
    for r in with_files:  # later deploys win: what should be live now
        for f in r.files:
            expected[f.path] = f.new_sha256
    if to is None:
        last = with_files[-1]
        todo = [RestoredFile(f.path, f.new_sha256, f.old_sha256, f.backup) for f in last.files]
        return last, todo, expected
    exact = [r for r in records if r.id == to]
    matches = exact or [r for r in records if to and r.id.startswith(to)]
    if len({r.id for r in matches}) > 1:  # an ambiguous prefix must not pick one quietly
        raise UsageError(
            f"{to!r} matches {len(matches)} deploys ({', '.join(r.id for r in matches[:5])}"
            f"{', ...' if len(matches) > 5 else ''})",
            hint="give more of the deploy id; `kerneldev log` lists them",
        )
    target = matches[0] if matches else None
    if target is None:
        raise UsageError(
            f"no deploy {to!r} in the history", hint="`kerneldev log` lists the deploy ids"
        )
    later = [r for r in with_files if r.id > target.id]
    todo, seen = [], set()
    for r in later:  # the first later deploy of a path backed up its bytes as of `target`
        for f in r.files:
            if f.path in seen:
                continue
            seen.add(f.path)
            if expected[f.path] != f.old_sha256:
                todo.append(RestoredFile(f.path, expected[f.path], f.old_sha256, f.backup))
    return target, todo, expected


def rollback(
    transport: Transport,
    host: HostConfig,
    force: bool = False,
    on_progress: ProgressCallback | None = None,
    *,
    to: str | None = None,
    dry_run: bool = False,
    outcome: str = "deployed",
    import_check: bool = False,
) -> RollbackResult:
    """Without `to`: restore the files of the last deploy (anyone's) from its host backups.
    With `to`: put every file changed since deploy `to` back to its bytes right after it.
    Recorded as a deploy of its own, so a second rollback re-applies what the first undid.
    Call it holding the host lock."""
    state = load_state(host.workspace, host.name)
    check_state_owner(state, host)
    records = deploy_history(transport, host)
    target, todo, _ = _restore_plan(records, to)
    result = RollbackResult(host=host.name, deploy_id=None, rolls_back=target.id, dry_run=dry_run)
    result.plan = todo
    if not todo:
        if to is None:
            raise NothingToRollBackError(
                f"the last deploy {target.id} changed no files; nothing to roll back"
            )
        return result

    live_files, _ = transport.hash_files(host.root, [glob_escape(r.path) for r in todo])
    live = {f.path: f for f in live_files}
    # A file that already has the bytes to restore (an earlier, interrupted rollback got that
    # far) needs nothing: re-running converges.
    todo = [
        r for r in todo if (live[r.path].sha256 if r.path in live else None) != r.restore_sha256
    ]
    result.plan = todo
    if not todo:
        return result
    changed = [
        r.path for r in todo if (live[r.path].sha256 if r.path in live else None) != r.live_sha256
    ]
    if changed and not force:
        raise RefusedError(
            f"rollback refused, changed on the host since deploy {target.id}: "
            + printable_list(changed),
            hint="see `kerneldev diff`; `kerneldev rollback --force` restores the backups anyway",
        )
    for r in todo:
        if r.restore_sha256 is not None and r.backup is None:
            raise TransferError(f"deploy {target.id} recorded no backup for {r.path}")
    # Check every backup before touching anything, so a missing one stops us early.
    backups = [r for r in todo if r.restore_sha256 is not None]
    found, _ = transport.hash_files(host.root, [glob_escape(r.backup) for r in backups])
    got = {f.path: f.sha256 for f in found}
    for r in backups:
        if got.get(r.backup) != r.restore_sha256:
            what = "is missing" if r.backup not in got else "does not match its recorded sha256"
            raise TransferError(
                f"the backup of {r.path} on the host ({r.backup}) {what}; nothing was restored",
                hint="backups older than the last `keep_backups` deploys are pruned",
            )
    if dry_run:
        return result

    check_writable(Path(host.workspace), "rollback")
    result.notes += push_pipeline.clean_leftovers(transport, host)
    record = DeployRecord(
        id=new_deploy_id(),
        time=now_iso(),
        host=host.name,
        user=local_user(),
        kind="rollback",
        rolls_back=target.id,
        outcome=outcome,
    )
    result.deploy_id = record.id
    steps = []
    for r in todo:
        now = live.get(r.path)
        step = DeployStep(r.path, now.sha256 if now else None, now.mode if now else None, None)
        step.restore_from, step.new_sha256 = r.backup, r.restore_sha256
        steps.append(step)
    deploy = Deploy(host, record, steps, force=force)
    land = push_pipeline.restore_from_backups(transport, found, on_progress)

    new: dict[str, bytes | None] = {}
    if import_check:  # the restored modules' bytes, read from their (small) .py backups
        for r in todo:
            if r.path.endswith(".py"):
                new[r.path] = (
                    transport.read_bytes(posixpath.join(host.root, r.backup))
                    if r.restore_sha256 is not None
                    else None
                )
    with check_deploy(transport, host, result, new, import_check, None):
        push_pipeline.run_deploy(transport, deploy, land)
        result.files = record.files
    return result


# --- log --------------------------------------------------------------------------------


@dataclass
class LoggedFile:
    path: str
    old_sha256: str | None
    new_sha256: str | None
    live: bool  # the deploy's bytes for this path are what the host has now


@dataclass
class LogEntry:
    id: str
    time: str
    user: str
    kind: str
    outcome: str
    rolls_back: str | None
    files: list[LoggedFile] = field(default_factory=list)


def deploy_log(transport: Transport, host: HostConfig) -> list[LogEntry]:
    """Every deploy on the host (the shared history plus this workspace's records), oldest
    first, with whether each file's deployed bytes are still live."""
    records = deploy_history(transport, host)
    paths = sorted({f.path for r in records for f in r.files})
    live_files, _ = (
        transport.hash_files(host.root, [glob_escape(p) for p in paths]) if paths else ([], [])
    )
    live = {f.path: f.sha256 for f in live_files}
    return [
        LogEntry(
            r.id,
            r.time,
            r.user,
            r.kind,
            r.outcome,
            r.rolls_back,
            [
                LoggedFile(f.path, f.old_sha256, f.new_sha256, live.get(f.path) == f.new_sha256)
                for f in r.files
            ],
        )
        for r in records
    ]
