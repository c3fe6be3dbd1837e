"""`kerneldev watch`: push on save, over one SSH connection kept for the watcher's whole life.

The workspace is watched with `watchfiles` (inotify on Linux) in a background thread; only the
tracked files count (the configured `files`, or the PATHS given), never `.kerneldev/` nor
editor temporaries and backups (vim's `4913` probe and `file~`, emacs' `.#file`, swap files,
`*.tmp`). Changes are gathered into bursts: a burst ends when `debounce` seconds pass without
another change, so an editor's save (write a temporary file and rename it, several writes in a
row) is one burst, and each burst is one push.

Each burst is pushed as `kerneldev push` does it, with `sync.push`: holding the host lock,
drifted and conflicting files refused (the others in the burst still go), atomic uploads
backed up and recorded in the deploy history, the import check. Then, when asked, the service
is restarted and waited for (an unhealthy service gets the deploy rolled back and restarted
again, as `push --restart` does), and a quick correctness + timing check of the kernel variants
runs on the host (`bench.run_bench` on the live kernel file, i.e. what was just pushed).
Each burst ends in one `WatchEvent` handed to `on_event`.

A dropped connection is reopened with exponential backoff (reported as events); changes saved
meanwhile are pushed after reconnecting. Ctrl-C / SIGTERM between bursts ends the watch
normally (`Watcher.run` returns); during a push it ends that push exactly as `push` ends under
a signal (`interrupt.Interrupted` propagates: a target is its old or its new version, the
deploy record lists what landed), and the lock is released.

The core never imports typer or rich.
"""

from __future__ import annotations

import os
import posixpath
import queue
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kerneldev import interrupt
from kerneldev.bench import kernel_bench as bench
from kerneldev.config import HostConfig
from kerneldev.errors import (
    DeployTally,
    HostConnectionError,
    HostKeyError,
    ImportFailedError,
    KerneldevError,
    LockBusyError,
    RefusedError,
    ServiceError,
    UnhealthyError,
    UsageError,
)
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop import deploy_tally, release, sync
from kerneldev.loop import lock as host_lock
from kerneldev.loop.state import STATE_DIR, now_iso
from kerneldev.loop.workspace import is_configured, resolve_paths
from kerneldev.service import restart as service
from kerneldev.service.restart import ServiceHealth

DEFAULT_DEBOUNCE = 0.3  # seconds of quiet that end a burst of saves
MAX_BURST = 5.0  # a burst is pushed after this many seconds even if changes keep coming
KEEPALIVE = 20.0  # seconds idle between two checks that the connection is still up
BACKOFF_FIRST = 0.5  # seconds before the first reconnect attempt; doubles per attempt
BACKOFF_MAX = 30.0
RECONNECT_TIMEOUT = 5.0  # seconds per connection step while reconnecting
READY_TIMEOUT = 20.0  # seconds to wait for the file watcher to see its first event
POLL = 0.2  # seconds between checks for Ctrl-C while waiting

# Event kinds.
READY, PUSH, DISCONNECTED, RECONNECTED, STOPPED = (
    "ready",
    "push",
    "disconnected",
    "reconnected",
    "stopped",
)
# Outcomes of a push event.
PUSHED = "pushed"  # something landed (and stayed: healthy, or no restart asked)
UNCHANGED = "unchanged"  # live already had the saved bytes
REFUSED = "refused"  # every saved file drifted / conflicts on the host: nothing pushed
ROLLED_BACK = "rolled-back"  # pushed, the service never became healthy, rolled back
UNHEALTHY = "unhealthy"  # pushed, never healthy, left in place (no rollback asked)
FAILED = "failed"  # the push or restart failed (import check, lock busy, restart command)
WAITING = "waiting"  # the connection dropped: the files are pushed after reconnecting

# Editors' temporaries and backups, by file name: never pushed even when a glob matches them.
_EDITOR_TEMP = re.compile(
    r"""(
        ~$ | ^4913$ | ^\.\#.* | ^\#.*\#$ | \.sw[a-p]$ | \.tmp$ | \.kate-swp$
        | ___jb_(tmp|old)___$ | ^\.goutputstream- | ^\.~lock\.
    )""",
    re.VERBOSE,
)


def is_editor_temp(name: str) -> bool:
    """True for file names editors use for temporaries, swap files and backups."""
    return bool(_EDITOR_TEMP.search(name))


@dataclass
class WatchOptions:
    paths: list[str] | None = None  # PATHS as given (None: every configured file)
    restart: bool = False
    rollback_on_unhealthy: bool = True  # --restart: roll back a deploy that never gets healthy
    import_check: bool = True
    bench_shapes: str | None = None  # QUICK-SPEC: a shape set name or one shape; None: no check
    bench_variants: tuple[str, ...] = ("simt", "mma")
    bench_cpu: bool = False  # the Triton interpreter on the host's CPU
    results_dir: Path | None = None  # where bench results are saved
    debounce: float = DEFAULT_DEBOUNCE
    lock_wait: float = host_lock.DEFAULT_WAIT
    keepalive: float = KEEPALIVE


@dataclass
class RefusedFile:
    path: str
    status: str  # drifted / conflict / missing-live
    reason: str | None


@dataclass
class CheckSummary:
    """The quick check's verdict: accuracy of every variant on every shape, and its time."""

    ok: bool
    verdict: str  # "ok", "failed", "error"
    median_us: dict[str, float | None] = field(default_factory=dict)  # variant -> geomean µs
    speedup: dict[str, float | None] = field(default_factory=dict)  # variant -> vs the first
    failed: list[str] = field(default_factory=list)  # "shape variant" that failed or did not run
    message: str | None = None  # why the check could not run ("error")
    cpu: bool = False  # interpreter times: meaningless
    seconds: float | None = None
    saved_to: str | None = None


@dataclass
class WatchEvent:
    """One line of the watch's output. `kind` says which fields mean something."""

    kind: str  # ready / push / disconnected / reconnected / stopped
    host: str
    time: str
    seq: int = 0  # push events are numbered from 1
    outcome: str | None = None  # push: see the outcome constants
    changed: list[str] = field(default_factory=list)  # tracked files saved in this burst
    deployed: list[str] = field(default_factory=list)
    deploy_id: str | None = None
    refused: list[RefusedFile] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # saved, then deleted before the push
    seconds: float | None = None  # push: plan, backups, uploads, import check, record
    health: ServiceHealth | None = None
    rollback_id: str | None = None  # the automatic rollback's deploy id
    check: CheckSummary | None = None
    message: str | None = None
    hint: str | None = None
    attempt: int | None = None  # disconnected: the reconnect attempt that comes next
    retry_in: float | None = None  # disconnected: seconds until that attempt
    waiting: list[str] = field(default_factory=list)  # changes not pushed yet
    watching: list[str] = field(default_factory=list)  # ready: what is watched
    workspace: str | None = None
    root: str | None = None
    signal: str | None = None  # stopped: SIGINT / SIGTERM
    notes: list[str] = field(default_factory=list)


EventCallback = Callable[[WatchEvent], None]
ProgressCallback = Callable[[str], None]
Opener = Callable[..., Transport]


class _FileChanges:
    """watchfiles in a background thread: puts each batch of changed tracked paths (relative
    to the workspace) on a queue. It is ready once it has seen its own probe file."""

    def __init__(self, workspace: Path, tracked: Callable[[str], bool], debounce_ms: int):
        import watchfiles  # imported here: only `watch` needs it

        self._watchfiles = watchfiles
        self.workspace = Path(os.path.abspath(workspace))
        self.tracked = tracked
        self.step = max(10, min(50, debounce_ms))
        self.queue: queue.Queue[set[str] | BaseException] = queue.Queue()
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.probe = self.workspace / STATE_DIR / f"watch-probe-{secrets.token_hex(4)}"
        self.thread = threading.Thread(target=self._run, name="kerneldev-watch", daemon=True)

    def _rel(self, path: str) -> str | None:
        try:
            rel = Path(path).relative_to(self.workspace).as_posix()
        except ValueError:
            return None
        return rel

    def _keep(self, change, path: str) -> bool:
        if path == str(self.probe):
            return True
        rel = self._rel(path)
        if rel is None:
            return False
        # A folder moved or copied in (a checkout swapped in, `mv new old`): inotify reports
        # only the folder, not the files it brings, so it is kept and looked into.
        if change == self._watchfiles.Change.added and os.path.isdir(path):
            return rel != STATE_DIR and not rel.startswith(STATE_DIR + "/")
        return self.tracked(rel)

    def _tracked_under(self, folder: str) -> set[str]:
        """The tracked files inside a folder that appeared in the workspace."""
        found = set()
        for parent, dirs, names in os.walk(folder):
            dirs[:] = [d for d in dirs if d != STATE_DIR]
            for name in names:
                rel = self._rel(os.path.join(parent, name))
                if rel is not None and self.tracked(rel):
                    found.add(rel)
        return found

    def _run(self) -> None:
        try:
            for changes in self._watchfiles.watch(
                self.workspace,
                watch_filter=self._keep,
                debounce=int(MAX_BURST * 1000),
                step=self.step,
                stop_event=self.stop_event,
                raise_interrupt=False,
            ):
                paths = set()
                for _change, path in changes:
                    if path == str(self.probe):
                        self.ready.set()
                        continue
                    rel = self._rel(path)
                    if rel is not None and os.path.isdir(path):
                        paths |= self._tracked_under(path)
                    elif rel is not None:
                        paths.add(rel)
                if paths:
                    self.queue.put(paths)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            self.queue.put(err)
            self.ready.set()

    def start(self) -> None:
        """Start watching; return once the watcher sees changes (a probe file written under
        `.kerneldev/` until it is noticed), so a save right after this is not missed."""
        self.probe.parent.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while not self.ready.wait(0.1):
                interrupt.check()
                if time.monotonic() > deadline:
                    raise KerneldevError(
                        f"the file watcher saw no change in {self.workspace} within "
                        f"{READY_TIMEOUT:g}s",
                        hint="set WATCHFILES_FORCE_POLLING=1 where inotify does not work "
                        "(network file systems)",
                    )
                self.probe.write_text(str(time.monotonic()))
        finally:
            try:
                self.probe.unlink()
            except OSError:
                pass
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if not self.thread.is_alive() and not self.stop_event.is_set():
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, BaseException):
                    raise KerneldevError(f"the file watcher stopped: {item}") from None

    def get(self, timeout: float) -> set[str] | None:
        """The next batch, or None after `timeout` seconds."""
        try:
            item = self.queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            raise KerneldevError(f"the file watcher stopped: {item}") from None
        return item

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=2)


class Watcher:
    """Watch `host`'s workspace and push each burst of saves; see the module docstring."""

    def __init__(
        self,
        host: HostConfig,
        options: WatchOptions,
        on_event: EventCallback,
        *,
        on_progress: ProgressCallback | None = None,
        opener: Opener = open_transport,
    ) -> None:
        self.host = host
        self.options = options
        self.on_event = on_event
        self.on_progress = on_progress or (lambda _text: None)
        self.opener = opener
        self.transport: Transport | None = None
        self.seq = 0
        self.selected = resolve_paths(host, options.paths)  # UsageError (exit 2) for bad PATHS
        if options.bench_shapes is not None:
            bench.check_request(list(options.bench_variants), [options.bench_shapes])
        if options.restart:
            service.require_service(host.service, host.name)
        if options.debounce < 0:
            raise UsageError("--debounce must be 0 or more milliseconds")
        if not Path(host.workspace).is_dir():
            raise UsageError(
                f"the workspace {host.workspace} of host '{host.name}' does not exist",
                hint="run `kerneldev pull` first",
            )
        # Connection state: `down_since` is set while the connection is lost.
        self.down_since: float | None = None
        self.attempt = 0
        self.next_attempt = 0.0
        self.last_contact = time.monotonic()

    # --- what counts as a save -----------------------------------------------------------
    def tracked(self, rel: str) -> bool:
        """A workspace path (relative) that a save of should push."""
        if rel == STATE_DIR or rel.startswith(STATE_DIR + "/"):
            return False
        if is_editor_temp(posixpath.basename(rel)):
            return False
        if self.selected is not None:
            return rel in self.selected
        return is_configured(self.host, rel)

    def _named(self, rels: list[str] | None) -> list[str] | None:
        """Root-relative paths as absolute workspace paths: what `sync` reads them as
        whatever the current folder is (a relative one could be read from there)."""
        if rels is None:
            return None
        workspace = Path(os.path.abspath(self.host.workspace))
        return [str(workspace / rel) for rel in rels]

    def _event(self, kind: str, **fields) -> WatchEvent:
        event = WatchEvent(kind=kind, host=self.host.name, time=now_iso(), **fields)
        self.on_event(event)
        return event

    # --- the loop ------------------------------------------------------------------------
    def run(self) -> WatchEvent:
        """Watch until Ctrl-C / SIGTERM between bursts; returns the `stopped` event. Errors
        that end the watch (the first connection fails, a changed host key, a signal during
        a push) propagate."""
        self.transport = self.opener(self.host)
        changes = _FileChanges(
            Path(self.host.workspace), self.tracked, int(self.options.debounce * 1000)
        )
        try:
            plan = sync.plan_push(self.transport, self.host, self._named(self.selected))
            self.last_contact = time.monotonic()
            changes.start()
            workspace_dir = Path(self.host.workspace)
            edited = [f.path for f in plan.uploads]
            watching = [f.path for f in plan.files] if self.selected is None else self.selected
            notes = []
            if edited:
                notes.append(
                    f"not pushed yet (save them again, or `kerneldev push`): {', '.join(edited)}"
                )
            if self.selected is not None:
                absent = [p for p in self.selected if not (workspace_dir / p).is_file()]
                if absent:
                    notes.append(
                        f"not in the workspace (yet): {', '.join(absent)}; a PATH is one file "
                        "by its literal name (a glob in it is not expanded)"
                    )
            if plan.refused:
                notes.append(
                    "changed on the host since the last pull/push: "
                    + ", ".join(f"{f.path} ({f.status})" for f in plan.refused)
                )
            self._event(
                READY,
                watching=list(watching),
                workspace=str(Path(self.host.workspace)),
                root=self.host.root,
                notes=notes,
            )
            pending: dict[str, None] = {}  # an ordered set of saved, not yet pushed paths
            while True:
                if interrupt.requested():
                    break
                changes.raise_if_failed()
                burst = self._next_burst(changes)
                if burst:
                    pending.update(dict.fromkeys(sorted(burst)))
                if interrupt.requested():
                    break
                if self.down_since is not None:
                    if time.monotonic() >= self.next_attempt:
                        self._reconnect(list(pending))
                    if self.down_since is not None:
                        continue
                if pending:
                    paths = list(pending)
                    if self._push(paths):
                        pending.clear()
                elif time.monotonic() - self.last_contact >= self.options.keepalive:
                    self._keepalive()
        finally:
            with interrupt.shield():
                changes.stop()
                if self.transport is not None:
                    self.transport.close()
        signum = interrupt.consume()
        name = None if signum is None else signal.Signals(signum).name
        return self._event(STOPPED, seq=self.seq, signal=name, waiting=list(pending))

    def _next_burst(self, changes: _FileChanges) -> set[str]:
        """The paths of the next burst of saves (empty when there was none before the next
        keepalive or reconnect is due, or a signal came)."""
        if self.down_since is not None:
            until = self.next_attempt
        else:
            until = self.last_contact + self.options.keepalive
        burst: set[str] = set()
        while not burst:
            if interrupt.requested():
                return burst
            left = until - time.monotonic()
            if left <= 0:
                return burst
            got = changes.get(min(POLL, left))
            if got:
                burst |= got
        # More changes within `debounce` belong to the same save.
        quiet_until = time.monotonic() + self.options.debounce
        cap = time.monotonic() + MAX_BURST
        while not interrupt.requested():
            left = min(quiet_until, cap) - time.monotonic()
            if left <= 0:
                break
            got = changes.get(min(POLL, left))
            if got:
                burst |= got
                quiet_until = time.monotonic() + self.options.debounce
        return burst

    # --- connection ------------------------------------------------------------------------
    def _lost(self, err: KerneldevError, waiting: list[str]) -> None:
        """The connection dropped: close it and schedule the first reconnect attempt."""
        if self.transport is not None:
            with interrupt.shield():
                self.transport.close()
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.attempt = 0
        self._schedule_retry(err, waiting)

    def _schedule_retry(self, err: KerneldevError, waiting: list[str]) -> None:
        self.attempt += 1
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (self.attempt - 1))
        self.next_attempt = time.monotonic() + delay
        self._event(
            DISCONNECTED,
            message=err.message,
            attempt=self.attempt,
            retry_in=delay,
            waiting=list(waiting),
        )

    def _reconnect(self, waiting: list[str]) -> None:
        self.on_progress(f"reconnecting to {self.host.name} (attempt {self.attempt})")
        transport = None
        try:
            # Inside the try: a kept session's opener connects at once (its holder starts
            # now), so a host still down fails here, not at the first request.
            transport = self.opener(self.host, connect_timeout=RECONNECT_TIMEOUT)
            transport.run("true", timeout=RECONNECT_TIMEOUT * 2)
        except interrupt.Interrupted:
            with interrupt.shield():
                if transport is not None:
                    transport.close()
            return  # Ctrl-C while reconnecting: between events, the loop ends the watch
        except HostKeyError:
            if transport is not None:
                transport.close()
            raise  # a changed host key is not a dropped connection: stop and say so
        except KerneldevError as err:  # unreachable, or up but not answering yet
            with interrupt.shield():
                if transport is not None:
                    transport.close()
            self._schedule_retry(err, waiting)
            return
        down = time.monotonic() - (self.down_since or time.monotonic())
        self.transport = transport
        self.down_since = None
        self.last_contact = time.monotonic()
        self._event(
            RECONNECTED,
            attempt=self.attempt,
            seconds=down,
            waiting=list(waiting),
        )

    def _probe(self) -> HostConnectionError | None:
        """One round trip on the connection: the error when it is gone, else None."""
        assert self.transport is not None
        try:
            self.transport.run("true", timeout=10)
        except interrupt.Interrupted:
            return None  # Ctrl-C during the check: the loop ends the watch (exit 0)
        except HostKeyError:
            raise
        except HostConnectionError as err:
            return err
        except KerneldevError:
            pass  # a slow host is not a lost connection
        self.last_contact = time.monotonic()
        return None

    def _keepalive(self) -> None:
        """Check the idle connection; schedule a reconnect when it is gone."""
        lost = self._probe()
        if lost is not None:
            self._lost(lost, [])

    # --- one burst -------------------------------------------------------------------------
    def _push(self, paths: list[str]) -> bool:
        """Push one burst and report it as an event. False when the connection dropped before
        the outcome was known (the paths stay pending for after the reconnect) or another
        deploy held the host lock throughout (they stay pending for the next round)."""
        assert self.transport is not None
        existing = [p for p in paths if (Path(self.host.workspace) / p).is_file()]
        ignored = [p for p in paths if p not in existing]
        self.seq += 1
        event = WatchEvent(
            kind=PUSH,
            host=self.host.name,
            time=now_iso(),
            seq=self.seq,
            changed=list(paths),
            ignored=ignored,
        )
        if not existing:
            event.outcome = UNCHANGED
            event.message = "the saved files were deleted from the workspace; watch never "
            event.message += "deletes files on the host"
            self.on_event(event)
            return True
        self.on_progress(f"pushing {', '.join(existing)} to {self.host.name}")
        started = time.monotonic()
        try:
            self._push_locked(event, existing, started)
        except interrupt.Interrupted as err:
            # As `push` says it: what landed (the deploy record has it too) and what did not.
            if event.deploy_id:
                tally = deploy_tally.stopped_at(event.deployed, event.deploy_id)
            else:
                tally = DeployTally((), tuple(existing))
            deploy_tally.attach(err, tally)
            raise
        except HostKeyError:
            raise
        except LockBusyError as err:
            # Another deploy held the lock through --lock-wait: the save is not lost, it stays
            # pending and the next round waits for the lock again (each wait says who holds it).
            event.outcome = FAILED
            event.message = err.message
            event.hint = "the save stays pending: it is pushed once the lock is free"
            self.on_event(event)
            # The host answered: the next round comes at the next save or keepalive, not at
            # once (with a short --lock-wait it would spin against the held lock).
            self.last_contact = time.monotonic()
            return False
        except KerneldevError as err:
            lost = err if isinstance(err, HostConnectionError) else self._probe()
            if (
                lost is None
                and isinstance(err, ImportFailedError)
                and isinstance(err.report, sync.PushResult)
            ):
                # The deploy landed, failed its import and was rolled back: both are records.
                pushed, check = err.report, err.report.import_check
                event.deploy_id, event.deployed = pushed.deploy_id, list(pushed.deployed)
                event.rollback_id = check.rolled_back_by if check is not None else None
            if lost is None:
                event.outcome = FAILED
                event.message, event.hint = err.message, err.hint
            elif event.deploy_id:
                # Lost after the deploy (during the restart or its rollback): the files are
                # live and recorded; pushing them again would change nothing, so say so.
                event.outcome = FAILED
                event.message = f"the connection was lost after the push: {lost.message}"
                event.hint = "the pushed files are live; run `kerneldev restart` if needed"
                self.on_event(event)
                self._lost(lost, [])
                return True
            else:
                # The connection went away: nothing is lost (uploads are atomic, the record
                # lists what landed); the burst is pushed again once reconnected.
                self._lost(lost, paths)
                self.seq -= 1
                return False
        self.last_contact = time.monotonic()
        if event.outcome == PUSHED and self.options.bench_shapes is not None:
            try:
                event.check = self._check()
            except interrupt.Interrupted:
                # The push is complete: its line still comes, then the signal ends the watch.
                event.check = CheckSummary(False, "error", message="interrupted")
                self.on_event(event)
                raise
        self.on_event(event)
        return True

    def _push_locked(self, event: WatchEvent, paths: list[str], started: float) -> None:
        """Lock, push (the non-refused files of the burst), restart when asked; fills `event`."""
        transport = self.transport
        assert transport is not None

        def on_wait(holder: host_lock.LockHolder | None) -> None:
            who = holder.describe() if holder else "another command"
            self.on_progress(f"waiting for the lock on {self.host.name}, held by {who}")

        # Taken by the push's first remote command (its scan), released by its last unless
        # the restart still needs it: a no-op save is one remote command (host_lock.py).
        lock = host_lock.HostLock(
            transport, self.host.root, "watch", wait=self.options.lock_wait, on_wait=on_wait
        )
        try:
            result = self._push_unrefused(event, paths, lock)
            event.seconds = time.monotonic() - started
            if result is None:
                return
            event.notes += result.notes
            event.deploy_id = result.deploy_id
            event.deployed = list(result.deployed)
            if not result.deploy_id:
                event.outcome = REFUSED if event.refused else UNCHANGED
                return
            event.outcome = PUSHED
            if self.options.restart:
                self._restart(event, result)
        finally:
            lock.release()

    def _push_unrefused(
        self, event: WatchEvent, paths: list[str], lock: host_lock.HostLock
    ) -> sync.PushResult | None:
        """`sync.push` handed the not yet taken `lock`; when some files drifted or conflict,
        push the others (still under that lock) and list those in `event.refused`. None when
        every file was refused."""
        assert self.transport is not None
        push = lambda chosen: sync.push(  # noqa: E731
            self.transport,
            self.host,
            self._named(chosen),
            import_check=self.options.import_check,
            lock=lock,
            release_lock=not self.options.restart,
        )
        try:
            return push(paths)
        except RefusedError as err:
            plan = err.report if isinstance(err.report, sync.PushResult) else None
            if plan is None or not plan.refused:
                raise  # the import check, a missing root: a failure of the whole burst
            event.notes += plan.notes  # a stale lock taken over, in the refused plan's notes
            event.refused = [RefusedFile(f.path, f.status, f.reason) for f in plan.refused]
            event.hint = (
                "see the changes with `kerneldev diff --patch`; pull and merge them, or "
                "`kerneldev push --force` to overwrite"
            )
        refused = {f.path for f in event.refused}
        rest = [p for p in paths if p not in refused]
        if not rest:
            event.outcome = REFUSED
            return None
        return push(rest)

    def _restart(self, event: WatchEvent, result: sync.PushResult) -> None:
        """Restart and wait for health; an unhealthy deploy is rolled back and the service
        restarted again (unless told not to), as `push --restart` does."""
        transport = self.transport
        assert transport is not None
        self.on_progress(f"restarting the service on {self.host.name}")

        def rolling_back(unhealthy: UnhealthyError) -> None:
            event.health = unhealthy.health
            self.on_progress(f"rolling back {result.deploy_id} on {self.host.name}")

        def rolled_back(undo: sync.RollbackResult) -> None:
            event.outcome = ROLLED_BACK  # recorded even if the restart below fails
            event.rollback_id = undo.deploy_id

        hooks = release.ReleaseHooks(
            lambda: service.restart(transport, self.host.service), rolling_back, rolled_back
        )
        try:
            outcome = release.restart_or_roll_back(
                transport,
                self.host,
                result.deploy_id,
                hooks,
                roll_back=self.options.rollback_on_unhealthy,
            )
        except ServiceError as err:
            event.outcome = FAILED
            event.message, event.hint = err.message, err.hint
            return
        event.health = outcome.health
        if outcome.unhealthy is None:
            return
        if outcome.rollback is None:
            event.outcome = UNHEALTHY
            event.message = outcome.unhealthy.message
            return
        event.message = f"{outcome.unhealthy.message}; after the rollback: {outcome.after}"
        event.hint = "fix the kernel and save again"

    def _check(self) -> CheckSummary:
        """The quick check: `bench.run_bench` on the live kernel file (what was just pushed)."""
        assert self.transport is not None
        options = self.options
        self.on_progress(f"checking the kernel variants on {self.host.name}")
        started = time.monotonic()
        try:
            result = bench.run_bench(
                self.transport,
                self.host,
                list(options.bench_variants),
                [options.bench_shapes or "smoke"],
                source="live",
                cpu_mode=options.bench_cpu,
                results_dir=options.results_dir,
                rotate=1,
            )
        except interrupt.Interrupted:
            raise
        except KerneldevError as err:
            return CheckSummary(
                ok=False,
                verdict="error",
                message=err.message,
                cpu=options.bench_cpu,
                seconds=time.monotonic() - started,
            )
        return summarize_check(result, time.monotonic() - started, options.bench_cpu)


def summarize_check(result: bench.BenchResult, seconds: float, cpu: bool) -> CheckSummary:
    """One bench run as the watch line shows it: pass/fail and each variant's time (the
    geometric mean of its medians over the shapes)."""
    rows = result.data.get("results", [])
    failed = [f"{r['shape']} {r['label']}" for r in rows if r.get("status") != "ok"]
    medians: dict[str, list[float]] = {}
    for r in rows:
        value = r.get("median_us")
        if r.get("status") == "ok" and isinstance(value, (int, float)) and value > 0:
            medians.setdefault(r["label"], []).append(float(value))
        else:
            medians.setdefault(r["label"], [])
    return CheckSummary(
        ok=result.ok,
        verdict="ok" if result.ok else "failed",
        median_us={label: bench.geometric_mean(v) for label, v in medians.items()},
        speedup=dict(result.ab.geomean),
        failed=failed,
        cpu=cpu,
        seconds=seconds,
        saved_to=str(result.saved_to) if result.saved_to else None,
    )
