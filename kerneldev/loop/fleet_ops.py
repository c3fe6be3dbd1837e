"""The loop's commands on a group of hosts (`--host GROUP` or a comma list): what each host does,
run through `fleet.run_on_hosts` / `fleet.run_in_waves`, and the cross-host comparisons.

- pull: from one reference host into its workspace; every other host's live files are compared
  with the reference's (`same`, `differs`, `missing`). A host that shares the reference's
  workspace gets its base recorded for the files identical to the reference (its own record in
  the shared state file); a host with a workspace of its own is pulled into it as usual.
- diff: each host's drift report, plus a hosts x files comparison of the live bytes: for each
  file the hosts whose live bytes are not those of the most hosts (on a tie, of the group that
  holds the earlier host) are flagged.
- push: each host as a single-host push does (lock, plan, backups, uploads, record). With
  `restart`: in waves (`run_in_waves`), each host pushing, restarting and waiting for health;
  a host whose health never comes is rolled back and restarted again (unless `no_rollback`),
  exactly as `push --restart` on one host, and the later waves are not started.
- restart, rollback, bench, bench --service: each host as on its own.

Nothing here prints: progress goes through the runner's events and results are dataclasses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import DiffersError, ExitCode, KerneldevError, UnhealthyError
from kerneldev.errors import GroupError as GroupError  # re-exported: it was defined here
from kerneldev.hosts import fleet
from kerneldev.hosts.fleet import HostEvent, HostOutcome, OutcomeStatus, Progress
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop import deploy_tally, drift, release, sync
from kerneldev.loop import lock as host_lock
from kerneldev.loop.push_pipeline import PushRequest
from kerneldev.loop.workspace import hash_patterns, resolve_paths
from kerneldev.service import restart as service_core
from kerneldev.status_words import StatusWord

EventCallback = Callable[[HostEvent], None]


class LiveMatch(StatusWord):
    """A host's live file against the reference host's (group comparisons)."""

    SAME = "same"
    DIFFERS = "differs"
    MISSING = "missing"


def describe_failures(outcomes: Sequence[HostOutcome]) -> str:
    """`2 of 3 hosts did not succeed: node1 (failed), node2 (unreachable)`."""
    bad = [o for o in outcomes if not o.ok]
    names = ", ".join(f"{o.host} ({o.status})" for o in bad)
    return f"{len(bad)} of {len(outcomes)} hosts did not succeed: {names}"


def _locked(
    transport: Transport,
    host: HostConfig,
    command: str,
    progress: Progress,
    break_lock: bool,
    lock_wait: float,
    create_root: bool = False,
    defer: bool = False,
) -> host_lock.HostLock:
    """`host_lock.lock_for`, its wait and notes told as the host's progress."""
    return host_lock.lock_for(
        transport, host.root, command, wait=lock_wait, break_lock=break_lock,
        say=progress, warn=lambda note: progress(note, warning=True),
        create_root=create_root, defer=defer,
    )  # fmt: skip


def _restart(transport: Transport, host: HostConfig, progress: Progress):
    svc = service_core.require_service(host.service, host.name)
    progress(f"restarting: {svc.restart}")

    def on_tick(elapsed: float, last: str | None) -> None:
        progress(f"waiting for health ({elapsed:.0f}s, last check: {last})")

    return service_core.restart(transport, svc, on_tick=on_tick)


# --- pull -------------------------------------------------------------------------------


@dataclass
class HostComparison:
    """One host's live files against the reference host's."""

    host: str
    reference: str
    files: dict[str, str] = field(default_factory=dict)  # path -> same / differs / missing
    pull: sync.PullResult | None = None  # when the host has a workspace of its own
    bases_recorded: list[str] = field(default_factory=list)  # shared workspace: same files

    @property
    def differing(self) -> list[str]:
        return [p for p, v in self.files.items() if v != LiveMatch.SAME]


def pull_group(
    hosts: Sequence[HostConfig],
    reference: HostConfig,
    paths: list[str] | None,
    *,
    force: bool = False,
    parallel: int = fleet.DEFAULT_PARALLEL,
    on_event: EventCallback | None = None,
) -> list[HostOutcome]:
    """Pull from `reference`, then compare every other host with it (see the module doc).
    The reference's outcome comes first; a host whose files differ from it ends `failed`."""

    def pull_reference(host: HostConfig, transport: Transport, progress: Progress):
        return sync.pull(transport, host, paths, force=force, on_progress=progress)

    [ref] = fleet.run_on_hosts([reference], pull_reference, parallel=1, on_event=on_event)
    others = [h for h in hosts if h.name != reference.name]
    if not ref.ok:
        why = f"not compared: the pull from the reference host {reference.name} failed"
        if ref.status == OutcomeStatus.UNREACHABLE and others:
            why += f"; `--from {others[0].name}` pulls from another host of the group"
        return [ref] + [fleet.skipped_outcome(h.name, why) for h in others]
    pulled: sync.PullResult = ref.result
    ref_sha = {f.path: f.sha256 for f in pulled.files}
    all_paths = sorted(set(ref_sha) | set(pulled.missing))

    def compare(host: HostConfig, transport: Transport, progress: Progress):
        selected = resolve_paths(host, paths)
        live_files, _ = transport.hash_files(host.root, hash_patterns(host, selected))
        live = {f.path: f.sha256 for f in live_files}
        cmp = HostComparison(host.name, reference.name)
        for path in sorted(set(all_paths) | set(live)):
            if path not in live:  # absent on both: same
                cmp.files[path] = LiveMatch.MISSING if path in ref_sha else LiveMatch.SAME
            else:
                cmp.files[path] = (
                    LiveMatch.SAME if live[path] == ref_sha.get(path) else LiveMatch.DIFFERS
                )
        if Path(host.workspace) == Path(reference.workspace):
            same = [p for p, v in cmp.files.items() if v == LiveMatch.SAME and p in ref_sha]
            if same:  # live == the workspace's new bytes: this host's base, nothing moves
                sync.pull(transport, host, same)
                cmp.bases_recorded = same
        else:
            cmp.pull = sync.pull(transport, host, paths, force=force, on_progress=progress)
        if cmp.differing:
            raise _differs(cmp)
        return cmp

    return [ref] + fleet.run_on_hosts(others, compare, parallel=parallel, on_event=on_event)


def _differs(cmp: HostComparison) -> DiffersError:
    """A compared host whose live files are not the reference's (exit 1, the comparison kept)."""
    names = ", ".join(f"{p} ({v})" for p, v in cmp.files.items() if v != LiveMatch.SAME)
    return DiffersError(
        f"live files differ from the reference host {cmp.reference}: {names}",
        hint=f"see `kerneldev diff --host {cmp.host}`; pull from it with --from {cmp.host}",
        report=cmp,
    )


# --- diff -------------------------------------------------------------------------------


@dataclass
class FleetDiff:
    """The hosts x files comparison of live bytes. `live[path][host]` is the live sha256 (None:
    missing on that host); `odd[path]` the hosts whose live bytes differ from the others'."""

    hosts: list[str]
    live: dict[str, dict[str, str | None]] = field(default_factory=dict)
    status: dict[str, dict[str, str]] = field(default_factory=dict)  # path -> host -> status
    odd: dict[str, list[str]] = field(default_factory=dict)

    @property
    def flagged_hosts(self) -> list[str]:
        flagged = {h for hosts in self.odd.values() for h in hosts}
        return [h for h in self.hosts if h in flagged]

    def as_json(self) -> dict[str, Any]:
        return {
            "hosts": self.hosts,
            "files": [
                {
                    "path": path,
                    "live_sha256": self.live[path],
                    "status": self.status.get(path, {}),
                    "differs_on": self.odd.get(path, []),
                }
                for path in sorted(self.live)
            ],
        }


def compare_live(reports: dict[str, drift.DriftReport], order: Sequence[str]) -> FleetDiff:
    """Flag, per file, the hosts whose live bytes are not the majority's (a tie goes to the
    group holding the earliest host in `order`)."""
    hosts = [h for h in order if h in reports]
    result = FleetDiff(hosts=hosts)
    for host in hosts:
        for f in reports[host].files:
            result.live.setdefault(f.path, {})[host] = f.live_sha256
            result.status.setdefault(f.path, {})[host] = f.status
    for path, per_host in result.live.items():
        for host in hosts:
            per_host.setdefault(host, None)  # not in that host's report: not on the host
        counts = Counter(per_host[h] for h in hosts)
        if len(counts) < 2:
            continue
        rank = {sha: i for i, sha in reversed(list(enumerate(per_host[h] for h in hosts)))}
        majority = max(counts, key=lambda sha: (counts[sha], -rank[sha]))
        result.odd[path] = [h for h in hosts if per_host[h] != majority]
    return result


def diff_group(
    hosts: Sequence[HostConfig],
    paths: list[str] | None,
    *,
    patch: bool = False,
    parallel: int = fleet.DEFAULT_PARALLEL,
    on_event: EventCallback | None = None,
) -> tuple[list[HostOutcome], FleetDiff]:
    """Each host's drift report (a host whose report is not ok ends `failed`, its report kept),
    then the cross-host comparison; a host flagged there ends `failed` too."""

    def one(host: HostConfig, transport: Transport, progress: Progress):
        report = drift.compute_drift(transport, host, paths, patch=patch)
        found = None
        try:
            from kerneldev.loop import history

            found = history.find_leftovers(transport, host.root)
        except interrupt.Interrupted:
            raise
        except KerneldevError:
            pass
        if found:
            report.warnings.append(
                f"leftovers of interrupted kerneldev runs: {found.describe()}; "
                "the next `kerneldev push` removes them"
            )
        return report

    outcomes = fleet.run_on_hosts(hosts, one, parallel=parallel, on_event=on_event)
    reports = {o.host: o.result for o in outcomes if o.ok}
    table = compare_live(reports, [h.name for h in hosts])
    flagged = set(table.flagged_hosts)
    for o in outcomes:
        if not o.ok:
            continue
        problems = []
        # Name the reason: a host whose files are all in sync can still fail on the mirror.
        unsynced = [f.path for f in o.result.files if f.status != drift.IN_SYNC]
        off_mirror = [f.path for f in o.result.files if f.mirror == drift.MIRROR_DIFFERS]
        if unsynced:
            problems.append(f"not in sync with the workspace: {len(unsynced)} file(s)")
        if off_mirror:
            problems.append("live differs from the mirror: " + ", ".join(off_mirror))
        if not o.result.files:
            problems.append("no files to compare")
        if o.host in flagged:
            odd = [p for p, hs in table.odd.items() if o.host in hs]
            problems.append("live differs from the other hosts: " + ", ".join(odd))
        if problems:
            o.status, o.exit_code = OutcomeStatus.FAILED, int(ExitCode.FAILURE)
            o.error = KerneldevError("; ".join(problems))
    return outcomes, table


# --- push -------------------------------------------------------------------------------


def push_host(
    transport: Transport, host: HostConfig, req: PushRequest, progress: Progress
) -> sync.PushResult:
    """One host's push (and restart, and automatic rollback), as `kerneldev push` does it on a
    single host. Errors carry the push result as their report where there is one."""
    if req.dry_run:
        return sync.push(
            transport, host, req.paths, force=req.force, dry_run=True, create_root=req.create_root
        )
    if req.restart:
        service_core.require_service(host.service, host.name)
    result: sync.PushResult | None = None
    try:
        # As a single-host push: the lock is taken by the push's first remote command and
        # released by its last unless the restart still needs it.
        lock = _locked(
            transport, host, "push", progress, req.break_lock, req.lock_wait, req.create_root, True
        )
        try:
            try:
                result = sync.push(
                    transport,
                    host,
                    req.paths,
                    force=req.force,
                    on_progress=lambda path: progress(f"uploading {path}"),
                    import_check=req.import_check,
                    create_root=req.create_root,
                    lock=lock,
                    release_lock=not req.restart,
                )
            finally:
                for note in lock.notes:  # a stale lock taken over, a lock broken: a warning
                    progress(note, warning=True)
            for note in result.notes:
                if note not in lock.notes:
                    progress(note)
            if req.restart:
                _restart_or_roll_back(transport, host, result, req.no_rollback, progress)
        finally:
            with interrupt.shield():
                lock.release()
    except interrupt.Interrupted as err:
        deploy_tally.attach(err, deploy_tally.stopped_at(result.deployed if result else None))
        err.report = result
        raise
    return result


def _restart_or_roll_back(
    transport: Transport,
    host: HostConfig,
    result: sync.PushResult,
    no_rollback: bool,
    progress: Progress,
) -> None:
    def rolling_back(_unhealthy: UnhealthyError) -> None:
        progress(f"not healthy; rolling back deploy {result.deploy_id}")

    hooks = release.ReleaseHooks(lambda: _restart(transport, host, progress), rolling_back)
    outcome = release.restart_or_roll_back(
        transport, host, result.deploy_id, hooks, roll_back=not no_rollback
    )
    release.raise_unless_healthy(result, outcome)


def push_group(
    hosts: Sequence[HostConfig],
    req: PushRequest,
    *,
    parallel: int = fleet.DEFAULT_PARALLEL,
    serial: int | None = None,
    on_event: EventCallback | None = None,
    on_wave: Callable[[int, list[HostConfig]], None] | None = None,
) -> list[HostOutcome]:
    """Push to every host; with `req.restart`, in waves of `serial` hosts (default 1) that stop
    after the first wave with a host that did not end healthy."""

    def one(host: HostConfig, transport: Transport, progress: Progress):
        return push_host(transport, host, req, progress)

    if req.restart and not req.dry_run:
        return fleet.run_in_waves(
            hosts,
            one,
            serial=serial or 1,
            parallel=parallel,
            on_event=on_event,
            on_wave=on_wave,
        )
    return fleet.run_on_hosts(hosts, one, parallel=parallel, on_event=on_event)


# --- restart, rollback --------------------------------------------------------------------


def restart_host(
    transport: Transport, host: HostConfig, progress: Progress, break_lock: bool, lock_wait: float
) -> service_core.ServiceHealth:
    service_core.require_service(host.service, host.name)
    lock = _locked(transport, host, "restart", progress, break_lock, lock_wait)
    try:
        return _restart(transport, host, progress)
    finally:
        with interrupt.shield():
            lock.release()


@dataclass
class RollbackRequest:
    force: bool = False
    to: str | None = None
    dry_run: bool = False
    restart: bool = False
    import_check: bool = True
    break_lock: bool = False
    lock_wait: float = host_lock.DEFAULT_WAIT


def rollback_host(
    transport: Transport, host: HostConfig, req: RollbackRequest, progress: Progress
) -> sync.RollbackResult:
    if req.restart and not req.dry_run:
        service_core.require_service(host.service, host.name)
    lock = (
        None
        if req.dry_run
        else _locked(transport, host, "rollback", progress, req.break_lock, req.lock_wait)
    )
    try:
        result = sync.rollback(
            transport,
            host,
            force=req.force,
            on_progress=lambda path: progress(f"restoring {path}"),
            to=req.to,
            dry_run=req.dry_run,
            import_check=req.import_check and not req.dry_run,
        )
        for note in result.notes:
            progress(note)
        if req.restart and not req.dry_run:
            try:
                result.health = _restart(transport, host, progress)
            except UnhealthyError as err:
                result.health = err.health
                raise release.with_result(err, result) from None
        return result
    finally:
        if lock is not None:
            with interrupt.shield():
                lock.release()
