"""The stages of one deploy, from the backups to the record, on plain data.

A push (`sync.push`) and a rollback (`sync.rollback`) plan under the host lock, then hand one
`Deploy` here: the files to change (`DeployStep`: what live is expected to be, what goes
there), the record to fill and the workspace bases to set. The stages run in this order:

1. back up (`back_up`): copy every live file to be replaced into the deploy's backup folder on
   the host, its marker holding the planned record, and check each copy;
2. upload and compare-and-swap rename (a `Lander`: `upload_from_workspace` for a push,
   `restore_from_backups` for a rollback): each file goes to a temporary file next to its
   target and is renamed over it only while live is still what the plan saw;
3. record (`record_deploy`): the workspace state, pruning old backups, the host's history (and,
   when nothing follows, the lock's release in the same command).

`run_deploy` runs them. Whatever stops it, the record lists exactly the files that landed and
the error carries them as data (`errors.DeployTally`). The stages take and return dataclasses
and a transport, never the CLI's callbacks (progress aside), so that back-up-to-record can move
into one host-side helper call later. Planning (`sync._plan`), the import check
(`import_check.check_deploy`) and the release step (`release.py`: restart, roll back when
unhealthy) sit around them.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import (
    ConnectionLostError,
    DeployTally,
    KerneldevError,
    LockLostError,
    PartialDeployError,
    RefusedError,
    TransferError,
)
from kerneldev.hosts.transport.agent_chain import AgentChain
from kerneldev.hosts.transport.base import (
    ByteCallback,
    LiveChangedError,
    PutFilesCallbacks,
    PutItem,
    RemoteFile,
    Transport,
    temp_path,
)
from kerneldev.loop import deploy_tally, history
from kerneldev.loop import lock as host_lock
from kerneldev.loop.lock import HostLock
from kerneldev.loop.state import DeployedFile, DeployRecord, State, update_state
from kerneldev.loop.workspace import glob_escape
from kerneldev.printable import printable

BACKUP_DIR = history.BACKUP_DIR  # under the host's root

ProgressCallback = Callable[[str], None]


@dataclass
class PushRequest:
    """What one push is asked to do, on one host or on each of a group's: the options of
    `kerneldev push`, for `sync.push` and the release step after it (kerneldev/loop/release.py)."""

    paths: list[str] | None = None
    force: bool = False
    dry_run: bool = False
    restart: bool = False
    no_rollback: bool = False
    import_check: bool = True
    create_root: bool = False
    break_lock: bool = False
    lock_wait: float = host_lock.DEFAULT_WAIT


@dataclass(frozen=True)
class BaseUpdate:
    """A workspace base to record when the command ends (`sha256` None: forget the path)."""

    path: str
    sha256: str | None
    size: int
    mode: int


@dataclass
class DeployStep:
    """One file of a deploy: what live is expected to be, and what to put there."""

    path: str
    old_sha256: str | None  # live as planned (None: absent)
    old_mode: int | None
    new_mode: int | None  # None: keep the replaced file's mode
    backup: str | None = None  # root-relative backup path, once backed up
    new_sha256: str | None = None  # what is planned to land (None: the file is removed)
    restore_from: str | None = None  # rollback: root-relative backup to copy back


@dataclass
class Deploy:
    """One deploy as the stages see it. `bases`: set whatever happens (files already in sync);
    the landed files' bases are added as they land, as are their entries in `record.files`."""

    host: HostConfig
    record: DeployRecord
    steps: list[DeployStep]
    force: bool = False  # no compare-and-swap check before a rename
    bases: list[BaseUpdate] = field(default_factory=list)

    @property
    def landed(self) -> list[str]:
        return [f.path for f in self.record.files]

    @property
    def not_landed(self) -> list[str]:
        done = set(self.landed)
        return [s.path for s in self.steps if s.path not in done]


# How a deploy's files land: `lander(deploy, landed)` puts each step in place (after the
# compare-and-swap check) and calls `landed(file, base)` as soon as it is renamed.
Landed = Callable[[DeployedFile, BaseUpdate], None]
Lander = Callable[[Deploy, Landed], None]


# --- stage: back up -----------------------------------------------------------------------


def back_up(transport: Transport, deploy: Deploy) -> None:
    """Copy every live file the deploy replaces into its backup folder, on the host, before
    any of them is replaced; then check each copy against the planned sha256. The folder's
    marker holds the planned record, so an interrupted deploy can be settled later."""
    host = deploy.host
    planned, pairs = _backup_plan(deploy)
    history.mark_incomplete(transport, host.root, planned)
    got = _backup_sums(deploy, transport.copy_on_host(pairs))
    if None in got.values():  # the host has no sha256sum: hash there with python
        folder = history.backup_folder(host.root, deploy.record.id)
        copied, _ = transport.hash_files(folder, [glob_escape(p) for p in got])
        got = {f.path: f.sha256 for f in copied}
    _check_backups(deploy, got)


def _backup_plan(deploy: Deploy) -> tuple[DeployRecord, list[tuple[str, str]]]:
    """Name each replaced file's backup; returns the planned record (the marker's content)
    and the (live, backup) pairs to copy on the host."""
    host, record, steps = deploy.host, deploy.record, deploy.steps
    for step in steps:
        if step.old_sha256 is not None:
            step.backup = posixpath.join(BACKUP_DIR, record.id, step.path)
    planned = replace(
        record,
        files=[
            DeployedFile(
                s.path,
                s.old_sha256,
                s.new_sha256,
                s.old_mode,
                s.new_mode if s.new_mode is not None else s.old_mode,
                s.backup,
            )
            for s in steps
        ],
    )
    pairs = [
        (posixpath.join(host.root, s.path), posixpath.join(host.root, s.backup))
        for s in steps
        if s.backup is not None
    ]
    return planned, pairs


def _check_backups(deploy: Deploy, got: dict[str, str | None]) -> None:
    """Each backup (path -> sha256 of the copy) must be the planned bytes."""
    for step in deploy.steps:
        if step.backup is not None and got.get(step.path) != step.old_sha256:
            raise RefusedError(
                f"{printable(step.path)} changed on the host while deploying (its backup does "
                "not match the planned bytes); nothing was replaced",
                hint="run `kerneldev diff` and try again",
            )


# --- stage: upload, compare-and-swap rename --------------------------------------------------


def changed_while_deploying(path: str) -> RefusedError:
    return RefusedError(
        f"{printable(path)} changed on the host while deploying; it was left as it is",
        hint="run `kerneldev diff` to see the change, then pull/merge or --force",
    )


class WorkspaceUpload:
    """A push's lander: every file in one transfer (one stream over SSH) from the workspace;
    each lands as `put_file` does, after the compare-and-swap check. Through the host agent
    `run_deploy` sends it in one chain with the backups and the record (`AgentChain`)."""

    def __init__(
        self,
        transport: Transport,
        on_progress: ProgressCallback | None = None,
        on_bytes: ByteCallback | None = None,
    ) -> None:
        self.transport = transport
        self.on_progress = on_progress
        self.on_bytes = on_bytes

    def items(self, deploy: Deploy, landed: Landed) -> tuple[list[PutItem], PutFilesCallbacks]:
        """The files to put and the callbacks that report each as it lands."""
        host, todo = deploy.host, deploy.steps
        items = [
            PutItem(
                posixpath.join(host.root, step.path),
                _opener(Path(host.workspace) / step.path),
                step.new_mode,
                step.old_sha256,
                check=not deploy.force,
            )
            for step in todo
        ]

        def started(i: int) -> None:
            if self.on_progress:
                self.on_progress(todo[i].path)
            interrupt.check()

        def done(i: int, sha: str, size: int) -> None:
            landed(*landed_file(todo[i], sha, size))

        return items, PutFilesCallbacks(done, started, self.on_bytes)

    def __call__(self, deploy: Deploy, landed: Landed) -> None:
        items, callbacks = self.items(deploy, landed)
        try:
            self.transport.put_files(
                items,
                on_landed=callbacks.on_landed,
                on_start=callbacks.on_start,
                on_bytes=callbacks.on_bytes,
            )
        except LiveChangedError as err:
            raise changed_while_deploying(deploy.steps[err.index].path) from None


def upload_from_workspace(
    transport: Transport,
    on_progress: ProgressCallback | None = None,
    on_bytes: ByteCallback | None = None,
) -> WorkspaceUpload:
    """A push's lander (`WorkspaceUpload`)."""
    return WorkspaceUpload(transport, on_progress, on_bytes)


def landed_file(step: DeployStep, sha: str, size: int) -> tuple[DeployedFile, BaseUpdate]:
    """A pushed file as its record and base say once it landed with `sha`."""
    new_mode = step.new_mode if step.new_mode is not None else step.old_mode
    return (
        DeployedFile(step.path, step.old_sha256, sha, step.old_mode, new_mode, step.backup),
        BaseUpdate(step.path, sha, size, new_mode or 0o644),
    )


def _opener(source: Path) -> Callable[[], BinaryIO]:
    def open_source() -> BinaryIO:
        try:
            return open(source, "rb")  # noqa: SIM115 - the transport closes it
        except OSError as err:
            raise TransferError(f"cannot read {source}: {err}") from None

    return open_source


def restore_from_backups(
    transport: Transport, backups: list[RemoteFile], on_progress: ProgressCallback | None = None
) -> Lander:
    """A rollback's lander, file by file: copy each step's backup (`restore_from`, one of the
    checked `backups`) next to its live file on the host, check live, rename; a step with no
    backup to restore (the deploy created the file) removes the live file."""

    def land_one(deploy: Deploy, step: DeployStep) -> tuple[DeployedFile, BaseUpdate]:
        host = deploy.host
        live_path = posixpath.join(host.root, step.path)
        check = _compare_and_swap(transport, deploy, step)
        if step.restore_from is None:
            check()
            interrupt.check()
            transport.remove(live_path)
            removed = DeployedFile(
                step.path, step.old_sha256, None, step.old_mode, None, step.backup
            )
            return removed, BaseUpdate(step.path, None, 0, 0)
        folder, name = posixpath.split(live_path)
        tmp = temp_path(folder, name)
        try:
            transport.copy_on_host([(posixpath.join(host.root, step.restore_from), tmp)])
            check()
            interrupt.check()
            transport.rename(tmp, live_path)
        except BaseException:
            with interrupt.shield():
                try:
                    transport.remove(tmp)
                except KerneldevError:
                    pass  # a cut connection: the next push removes it
            raise
        copied = next(f for f in backups if f.path == step.restore_from)  # cp -p keeps its mode
        mode = copied.mode
        restored = DeployedFile(
            step.path, step.old_sha256, step.new_sha256, step.old_mode, mode, step.backup
        )
        return restored, BaseUpdate(step.path, step.new_sha256, copied.size, mode)

    def land(deploy: Deploy, landed: Landed) -> None:
        for step in deploy.steps:
            if on_progress:
                on_progress(step.path)
            interrupt.check()
            landed(*land_one(deploy, step))

    return land


def _compare_and_swap(transport: Transport, deploy: Deploy, step: DeployStep) -> Callable[[], None]:
    """The compare-and-swap check run right before the rename: live must still be what the
    plan saw (anyone may have changed it, locked or not)."""

    def check() -> None:
        if deploy.force:
            return
        current = transport.file_sha256(posixpath.join(deploy.host.root, step.path))
        if current != step.old_sha256:
            raise changed_while_deploying(step.path)

    return check


# --- the stages in order --------------------------------------------------------------------


def run_deploy(
    transport: Transport,
    deploy: Deploy,
    land: Lander,
    release: HostLock | None = None,
    past: history.History | None = None,
    lock: HostLock | None = None,
) -> None:
    """Back up, then land every step, recording each landed file. Whatever stops it (an error,
    Ctrl-C, SIGTERM, a cut connection), the record lists exactly the files that landed, the
    local state and (when the host is still reachable) the host's history are written, and
    the error carries what was deployed and what was not (`tally`, and its summary in the
    message). `release`: a held lock to release in the same command as the record's append
    (pruning goes first, so all of it stays under the lock). `past`: the host's history as
    read under this lock (the push's scan), so pruning needs no request to read it.

    A push through the host agent sends the marker, the backups, the upload and the record
    in one chain (`_deploy_chained`): one round trip, each step still after the one before.
    `lock`: the host lock the deploy runs under (else `release`'s): each chained
    step checks on the host that it is still ours before it acts, since the host may still run
    the chain after its client is gone (a cut connection) and the lock is taken over. A step
    that finds it taken over stops the chain (`LockLostError`); then this command writes
    nothing more on the host (what landed is recorded here; the new holder's next push settles
    the deploy's marker on the host)."""
    record = deploy.record

    def landed(file: DeployedFile, base: BaseUpdate) -> None:
        deploy.bases.append(base)
        record.files.append(file)

    chain = transport.chain() if isinstance(land, WorkspaceUpload) else None
    recorded = False
    try:
        if chain is not None:
            guard = lock if lock is not None else release
            if guard is not None and guard.held:
                chain.hold(guard.guard())
            recorded = _deploy_chained(chain, deploy, land, landed, release, past)
        else:
            back_up(transport, deploy)
            land(deploy, landed)
    except BaseException as err:
        with interrupt.shield():
            stopped_by_signal = isinstance(err, interrupt.Interrupted)
            record.complete = False
            record.outcome = (
                "interrupted"
                if stopped_by_signal or isinstance(err, ConnectionLostError)
                else "partial"
            )
            # The lock is another command's now: nothing more is written on the host.
            record_stopped(transport, deploy, on_host=not isinstance(err, LockLostError))
            done, left = deploy.landed, deploy.not_landed
            tally = DeployTally(
                tuple(done), tuple(left), unconfirmed=isinstance(err, ConnectionLostError)
            )
            if stopped_by_signal:
                stopped = interrupt.Interrupted(
                    err.signum, f"{record.kind} {record.id} {err.message}"
                )
                raise deploy_tally.attach(stopped, tally) from None
            if isinstance(err, KerneldevError):
                reason = err.message
            elif isinstance(err, OSError):
                reason = str(err)
            else:
                raise
            if not done:
                if isinstance(err, KerneldevError):
                    deploy_tally.attach(err, tally)
                raise
            partial = PartialDeployError(
                f"{record.kind} {record.id} stopped midway: {reason}",
                done,
                left,
                hint="the deploy record lists what landed; `kerneldev rollback` undoes it, or "
                "fix the cause and push again",
            )
            raise deploy_tally.attach(partial, tally) from None
    with interrupt.shield():
        if recorded:  # the chain appended the record (and released the lock when it could)
            save_bases(deploy.host, deploy.bases, record)
            if release is None or release.held:
                prune(transport, deploy.host, record, past)
        else:
            record_deploy(transport, deploy, release if release and release.held else None, past)


def _deploy_chained(
    chain: AgentChain,
    deploy: Deploy,
    land: WorkspaceUpload,
    landed: Landed,
    release: HostLock | None,
    past: history.History | None,
) -> bool:
    """The stages as one chain of host requests (see `AgentChain`): the marker, the backups
    (checked on the host against the planned sha256), the upload, and - once every file's
    bytes are sent - the record as it will be when all of them land, with the marker's
    removal and, when no pruning can be needed (`past` known), the lock's release. The
    answers are read in order and raise what the stages would; leaving the chain early
    settles it (nothing more starts, what landed is reported). True when the record was
    appended by the chain (the lock released too when `release` is no longer held)."""
    host, record = deploy.host, deploy.record
    planned, pairs = _backup_plan(deploy)
    marker_path = posixpath.join(history.backup_folder(host.root, record.id), history.INCOMPLETE)
    finish = None
    releasing = False
    try:
        with chain:
            marker = chain.write_atomic(marker_path, history.record_line(planned).encode("utf-8"))
            expect = [s.old_sha256 for s in deploy.steps if s.backup is not None]
            copy = chain.copy_on_host(pairs, expect) if pairs else None
            items, callbacks = land.items(deploy, landed)
            upload = chain.put_files(items, callbacks, _workspace_bytes(deploy))
            releasing = release is not None and release.held and not _may_prune(host, record, past)
            if upload.all_sent:
                sent = upload.sent
                files = [landed_file(s, sent[i][0], 0)[0] for i, s in enumerate(deploy.steps)]
                line = history.record_line(replace(record, files=files))
                finish = chain.append_text(
                    history.history_path(host.root),
                    line,
                    remove=[marker_path],
                    release=release.guard() if releasing else None,
                )
            marker.result()
            if copy is not None:
                _check_backups(deploy, _backup_sums(deploy, copy.result()))
            try:
                upload.result()
            except LiveChangedError as err:
                raise changed_while_deploying(deploy.steps[err.index].path) from None
            if finish is None:
                return False
            with interrupt.shield():
                try:
                    finish.result()
                except LockLostError:
                    raise  # every file landed, the record is not appended: the marker stays
                except KerneldevError:
                    return False  # not appended: the caller appends (or the next push does)
    except interrupt.Interrupted:
        # Ctrl-C as the last file landed: when the chain's record made it to the host (its
        # append ran before the cancel came), the deploy is complete and recorded; the signal
        # stays pending and ends the command after the bookkeeping, as it would have then.
        if finish is None or not finish.succeeded or len(record.files) != len(deploy.steps):
            raise
    if releasing:
        release.released_on_host()
    return True


def _backup_sums(deploy: Deploy, sums: dict[str, str | None]) -> dict[str, str | None]:
    """Each backed-up step's path -> the sum of its copy (from `copy_on_host`'s answer)."""
    root = deploy.host.root
    return {s.path: sums.get(posixpath.join(root, s.backup)) for s in deploy.steps if s.backup}


def _workspace_bytes(deploy: Deploy) -> int:
    """The bytes of the files to push, as the workspace has them now (0 for one gone)."""
    total = 0
    for step in deploy.steps:
        try:
            total += (Path(deploy.host.workspace) / step.path).stat().st_size
        except OSError:
            pass
    return total


def _may_prune(host: HostConfig, pending: DeployRecord, past: history.History | None) -> bool:
    """Whether pruning after `pending` is appended can have work: unknown history, or more
    records than the backups kept."""
    if past is None:
        return True
    return len(past.records) + (pending.id not in past.ids) > host.keep_backups


# --- stage: record ----------------------------------------------------------------------------


def record_deploy(
    transport: Transport,
    deploy: Deploy,
    release: HostLock | None = None,
    past: history.History | None = None,
) -> None:
    """A deploy that ran to its end: the workspace state, pruning, the host's history (with
    `release`: and the lock's release, in the same command)."""
    save_bases(deploy.host, deploy.bases, deploy.record)
    prune(transport, deploy.host, deploy.record, past)
    append_history(transport, deploy.host, deploy.record, release)


def record_stopped(transport: Transport, deploy: Deploy, on_host: bool = True) -> None:
    """A deploy that stopped midway: what landed is recorded (state, history); nothing landed,
    its backups are dropped. Not `on_host` (its lock was taken over): the state alone."""
    record = deploy.record
    save_bases(deploy.host, deploy.bases, record if record.files else None)
    if not on_host:
        return
    if record.files:
        append_history(transport, deploy.host, record)
    else:
        drop_backups(transport, deploy.host, record.id)


def save_bases(host: HostConfig, bases: list[BaseUpdate], record: DeployRecord | None) -> None:
    """Apply this command's changes to the state file under its lock (read-modify-write):
    bases to set (sha None: forget the file) and the deploy record to append."""

    def change(state: State) -> None:
        state.host, state.root = host.name, host.root
        for base in bases:
            if base.sha256 is None:
                state.files.pop(base.path, None)
            else:
                kind = record.kind if record else "push"
                state.set_base(base.path, base.sha256, base.size, base.mode, kind)
        if record is not None and all(d.id != record.id for d in state.deploys):
            state.deploys.append(record)

    update_state(Path(host.workspace), change, host.name)


def append_history(
    transport: Transport, host: HostConfig, record: DeployRecord, release: HostLock | None = None
) -> None:
    """Append the record to the host's history; `release`: and release that lock in the same
    command (else the caller's `release` does it)."""
    try:
        history.append_record(
            transport, host.root, record, then=release.release_command() if release else ""
        )
    except KerneldevError:
        return  # the host went away; the next push from this workspace records it there
    if release is not None:
        release.released_on_host()


def drop_backups(transport: Transport, host: HostConfig, deploy_id: str) -> None:
    """Nothing landed: the deploy's backup folder is not needed (best effort)."""
    try:
        transport.remove(history.backup_folder(host.root, deploy_id))
    except KerneldevError:
        pass  # cleaned by the next push as an incomplete backup


def prune(
    transport: Transport,
    host: HostConfig,
    pending: DeployRecord | None = None,
    past: history.History | None = None,
) -> None:
    """Prune old backups; `pending`: a record about to be appended, counted as in the history
    already (so pruning can run before the append that releases the lock); `past`: the
    history as read under this lock, else it is read here."""
    try:
        if past is None:
            past = history.load_history(transport, host.root)
        past = history.History(list(past.records), past.unreadable_lines)
        if pending is not None and pending.id not in past.ids:
            past.records.append(pending)
        if len(past.records) <= host.keep_backups:
            return
        history.prune_backups(transport, host.root, past, host.keep_backups)
    except KerneldevError:
        pass  # pruning is housekeeping; the next deploy tries again


# --- under the lock, before the first stage -----------------------------------------------------


def clean_leftovers(
    transport: Transport, host: HostConfig, found: history.Leftovers | None = None
) -> list[str]:
    """Under the lock, before changing anything: remove what interrupted runs left behind.
    `found`: what the plan's scan (made under the same lock) saw; nothing found, nothing to do."""
    if found is not None and not found:
        return []
    past = history.load_history(transport, host.root)
    removed, notes = history.clean_leftovers(transport, host.root, past, found)
    if removed:
        notes.insert(0, f"removed leftovers of interrupted runs: {removed.describe()}")
    return notes
