"""pull, diff, push, rollback: the loop's commands. Each parses, calls the core, renders."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import typer

from kerneldev import interrupt
from kerneldev.cli import environment, output
from kerneldev.cli.common import (
    HOST_OPTION,
    JSON_OPTION,
    NO_IMPORT_CHECK_OPTION,
    PARALLEL_OPTION,
    flag,
    load_host,
    load_hosts,
)
from kerneldev.cli.host_steps import (
    locked,
    note_late_ctrl_c,
    print_patch,
    print_table,
    restart_with_progress,
)
from kerneldev.cli.output import HASH, PATH, STATUS, Column, print_info, print_json, print_warning
from kerneldev.config import HostConfig, remember_config
from kerneldev.errors import ExitCode, KerneldevError, UnhealthyError, UsageError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop import deploy_tally, drift, history, release, sync
from kerneldev.loop import lock as host_lock
from kerneldev.loop.push_pipeline import PushRequest
from kerneldev.printable import printable, printable_list
from kerneldev.service.restart import require_service

PATHS_ARGUMENT = typer.Argument(
    None,
    metavar="PATHS",
    help="Files to act on: workspace paths or paths relative to the host's root "
    "(default: every configured file).",
    show_default=False,
)

BREAK_LOCK_OPTION = flag(
    "--break-lock",
    help="Remove the host's lock even if its holder may still run (after making sure it does "
    "not: see the holder named when a command waits).",
)
LOCK_WAIT_OPTION = typer.Option(
    host_lock.DEFAULT_WAIT,
    "--lock-wait",
    metavar="SECONDS",
    min=0,
    help="How long to wait for another command's lock on the host.",
)
NO_KEEP_OPTION = flag(
    "--no-keep",
    help="Connect for this command only: neither use nor leave a kept session "
    "($KERNELDEV_NO_KEEP=1 does the same for every command).",
)
SERIAL_OPTION = typer.Option(
    None,
    "--serial",
    min=1,
    metavar="N",
    help="With a group and --restart: restart in waves of N hosts (default 1); the first wave "
    "with a host that does not become healthy stops the rest.",
    show_default=False,
)


def _short(sha: str | None) -> str | None:
    return sha[:12] if sha else None


def _progress(verb: str):
    """Per-file progress on stderr, only on a terminal."""
    env = environment.current()
    if not env.stderr_isatty:
        return None
    return lambda path: env.err_console.print(
        f"{verb} {printable(path)}", style="dim", markup=False
    )


def _open(host: HostConfig, *, prints: bool = False):
    """The host's transport. `prints`: the command ends with a message (pull, push), which is
    printed through rich, as is everything on a terminal; rich is then imported while a
    one-shot connection's host starts its agent (`Transport.while_agent_starts`), not after."""
    transport = open_transport(host)
    env = environment.current()
    if prints or env.stdout_isatty or env.stderr_isatty:
        transport.while_agent_starts = output.prefetch_rich
    return transport


def _no_keep(no_keep: bool):
    """--no-keep: this command's connections (one host or a group's) are one-shot."""
    if not no_keep:
        return contextlib.nullcontext()
    from kerneldev.hosts.transport.session.client import keeping

    return keeping(False)


def _byte_progress(host: HostConfig):
    """(a byte progress bar with human-readable sizes, its `on_plan`, its `on_bytes`) on a
    terminal; else (None, None, None). The bar is sized from the plan `sync.push` carries out
    (made under the host lock: another engineer may have pushed while this one waited for it)
    and shown from then on, only when there is something to upload."""
    env = environment.current()
    if not env.stderr_isatty:
        return None, None, None
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=env.err_console,
        transient=True,
    )
    task = progress.add_task("uploading", total=None)

    def on_plan(plan: sync.PushResult) -> None:
        total = 0
        for f in plan.uploads:
            try:
                total += (host.workspace / f.path).stat().st_size
            except OSError:
                pass
        progress.update(task, total=total)
        if plan.uploads:
            progress.start()

    return progress, on_plan, lambda n: progress.advance(task, n)


def _report_leftovers(transport: Transport, host: HostConfig) -> None:
    """Read-only commands only report what interrupted runs left; a push removes it."""
    try:
        found = history.find_leftovers(transport, host.root)
    except interrupt.Interrupted:
        raise
    except KerneldevError:
        return  # a report only: never fail the command for it
    if found:
        print_warning(_leftovers_warning(host, found))


def _leftovers_warning(host: HostConfig, found: history.Leftovers) -> str:
    return (
        f"{host.name} has leftovers of interrupted kerneldev runs: {found.describe()}; "
        "the next `kerneldev push` removes them"
    )


# --- pull -------------------------------------------------------------------------------


def pull_command(
    ctx: typer.Context,
    paths: list[str] | None = PATHS_ARGUMENT,
    force: bool = flag("--force", help="Overwrite workspace files that have unpushed edits."),
    from_host: str | None = typer.Option(
        None,
        "--from",
        metavar="HOST",
        help="With a group: the host to pull from (default: the group's first); the others "
        "are compared with it.",
        show_default=False,
    ),
    parallel: int = PARALLEL_OPTION,
    no_keep: bool = NO_KEEP_OPTION,
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Copy the live files from the host into the workspace (only what changed)."""
    ctx.with_resource(_no_keep(no_keep))
    config, hosts = load_hosts(ctx, host_name)
    if len(hosts) > 1:
        from kerneldev.cli.commands import group as group_cmd

        return group_cmd.pull(config, hosts, paths, force, from_host, parallel, as_json)
    host = hosts[0]
    if from_host is not None and from_host != host.name:
        raise UsageError(
            f"--from {from_host}: not the host this pull works on ({host.name})",
            hint="--from picks the reference host of a group (--host GROUP)",
        )
    with _open(host, prints=True) as transport:
        result = sync.pull(transport, host, paths, force=force, on_progress=_progress("pulling"))
    # The workspace now knows its config: kerneldev run inside it finds both.
    try:
        remember_config(host.workspace, config.path, host.name)
    except OSError as err:  # a convenience: the pull itself succeeded
        print_warning(f"could not note the config in the workspace: {err}")
    if as_json:
        print_json(result)
    else:
        print_table(
            f"pull from {host.name} into {result.workspace}",
            [
                Column("action", STATUS),
                Column("size", output.NUMBER),
                Column("sha256", HASH),
                Column("path", PATH),
            ],
            [(f.action, f.size, f.sha256, f.path) for f in result.files],
        )
        print_info(
            f"{result.transferred} transferred, "
            f"{len(result.files) - result.transferred} already identical"
        )
        for f in result.files:
            if f.discarded:
                print_warning(f"your edits to {printable(f.path)} were kept in {f.discarded}")
    for path in result.missing:
        print_warning(f"{printable(path)}: not on the host {host.name} under {host.root}")
    # A signal during the pull's last, shielded step (the record) or after it: every file
    # had landed and was recorded, so the pull succeeded and says so (as push).
    note_late_ctrl_c("the pull had completed")
    if result.missing:
        raise typer.Exit(int(ExitCode.FAILURE))


# --- diff -------------------------------------------------------------------------------


def diff_command(
    ctx: typer.Context,
    paths: list[str] | None = PATHS_ARGUMENT,
    patch: bool = flag(
        "--patch", "-p", help="Print unified diffs (live vs workspace, mirror vs live)."
    ),
    parallel: int = PARALLEL_OPTION,
    no_keep: bool = NO_KEEP_OPTION,
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Compare live, workspace, last sync and mirror. Exit 0 only when all is in sync."""
    ctx.with_resource(_no_keep(no_keep))
    _, hosts = load_hosts(ctx, host_name)
    if len(hosts) > 1:
        from kerneldev.cli.commands import group as group_cmd

        return group_cmd.diff(hosts, paths, patch, parallel, as_json)
    host = hosts[0]
    with _open(host) as transport:
        # The leftovers are looked for in the hashes' round trip: one remote command in all.
        report = drift.compute_drift(transport, host, paths, patch=patch, leftovers=True)
    if report.leftovers:
        print_warning(_leftovers_warning(host, report.leftovers))
    for warning in report.warnings:
        print_warning(warning)
    if as_json:
        print_json(report.as_json())
    else:
        render_drift(report)
        if patch:
            for f in report.files:
                if f.patch:
                    print_patch(f.patch)
                if f.mirror_patch:
                    print_patch(f.mirror_patch)
    if not report.ok:
        raise typer.Exit(int(ExitCode.FAILURE))


def render_drift(report: drift.DriftReport) -> None:
    mirror = f"mirror at {report.mirror_commit[:12]}" if report.mirror_commit else "mirror"
    print_table(
        f"{report.host}: live vs workspace, {mirror}",
        [Column("status", STATUS), Column("mirror", STATUS), Column("path", PATH)],
        [(f.status, f.mirror, f.path) for f in report.files],
    )
    for f in report.files:
        if f.note:
            print_info(f"{printable(f.path)}: {f.note}")


# --- push -------------------------------------------------------------------------------


def push_command(
    ctx: typer.Context,
    paths: list[str] | None = PATHS_ARGUMENT,
    dry_run: bool = flag("--dry-run", "-n", help="Show what would be uploaded; change nothing."),
    force: bool = flag("--force", help="Upload even files that drifted on the host or conflict."),
    restart: bool = flag("--restart", help="Restart the service after a successful push."),
    no_rollback: bool = flag(
        "--no-rollback",
        help="With --restart: leave the new files in place when the service does not become "
        "healthy (default: roll them back and restart again).",
    ),
    no_import_check: bool = NO_IMPORT_CHECK_OPTION,
    create_root: bool = flag(
        "--create-root", help="Create the host's `root` folder when it does not exist."
    ),
    break_lock: bool = BREAK_LOCK_OPTION,
    lock_wait: float = LOCK_WAIT_OPTION,
    parallel: int = PARALLEL_OPTION,
    serial: int | None = SERIAL_OPTION,
    no_keep: bool = NO_KEEP_OPTION,
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Upload the workspace files that differ from live: atomic, backed up, recorded."""
    ctx.with_resource(_no_keep(no_keep))
    if serial is not None and not restart:
        # Without a restart a group push has no waves: say so rather than ignore --serial.
        raise UsageError(
            "--serial needs --restart: only restarts go in waves",
            hint="use `push --restart --serial N`, or `--parallel N` to bound a plain push",
        )
    _, hosts = load_hosts(ctx, host_name)
    request = PushRequest(
        paths=paths,
        force=force,
        dry_run=dry_run,
        restart=restart,
        no_rollback=no_rollback,
        import_check=not no_import_check,
        create_root=create_root,
        break_lock=break_lock,
        lock_wait=lock_wait,
    )
    if len(hosts) > 1:
        from kerneldev.cli.commands import group as group_cmd

        return group_cmd.push(hosts, request, parallel, serial, as_json)
    host = hosts[0]
    if restart and not dry_run:
        require_service(host.service, host.name)  # fail before deploying, not after
    with _open(host, prints=True) as transport:
        if dry_run:
            result = sync.push(
                transport, host, paths, force=force, dry_run=True, create_root=create_root
            )
            _report_leftovers(transport, host)
            if not as_json:
                render_push(result)
        else:
            # The whole push, restart and any automatic rollback hold the host's lock.
            result = None
            with _summary_on_interrupt(lambda: result.deployed if result else None):
                # Taken by the push's first remote command; released by its last unless the
                # restart still needs it.
                lock = locked(transport, host, "push", break_lock, lock_wait, create_root, True)
                try:
                    result = _push_locked(transport, host, request, lock, as_json)
                    if restart:
                        _restart_or_roll_back(transport, host, result, no_rollback, as_json)
                finally:
                    lock.release()
    if as_json:
        print_json(result)
    if not dry_run:
        # A signal during the push's last, shielded steps (the record, the unlock) or after
        # them: nothing was cut short, so the push succeeded and says so.
        what = f"deploy {result.deploy_id}" if result.deploy_id else "the push"
        note_late_ctrl_c(f"{what} had completed")
    if dry_run and result.refused:
        raise typer.Exit(int(ExitCode.FAILURE))


@contextlib.contextmanager
def _summary_on_interrupt(landed: Callable[[], list[str] | None]) -> Iterator[None]:
    """Ctrl-C before the deploy's uploads (waiting for the lock, planning) or after them (the
    restart) still ends with the documented `Deployed: ...` summary. `landed()` is None while
    the deploy has not run."""
    try:
        yield
    except interrupt.Interrupted as err:
        deploy_tally.attach(err, deploy_tally.stopped_at(landed()))
        raise


def _push_locked(
    transport: Transport,
    host: HostConfig,
    request: PushRequest,
    lock: host_lock.HostLock,
    as_json: bool,
) -> sync.PushResult:
    """The push under `lock` (taken by its first remote command and released by its last
    unless the restart still needs it), with a byte progress bar, its notes and its table."""
    progress, on_plan, on_bytes = _byte_progress(host)
    try:
        result = sync.push(
            transport,
            host,
            request.paths,
            force=request.force,
            on_progress=None if progress else _progress("uploading"),
            on_bytes=on_bytes,
            import_check=request.import_check,
            create_root=request.create_root,
            lock=lock,
            release_lock=not request.restart,
            on_plan=on_plan,
        )
    finally:
        if progress is not None:
            progress.stop()
    for note in result.notes:
        print_warning(note)
    if not as_json:
        render_push(result)
        render_import_check(result.import_check)
    return result


def _restart_or_roll_back(transport, host, result: sync.PushResult, no_rollback, as_json):
    """Restart; when health never comes, roll this deploy back and restart again (unless
    --no-rollback), then fail reporting both outcomes (the logs were shown by the restart)."""

    def rolling_back(unhealthy: UnhealthyError) -> None:
        print_warning(f"rolling back deploy {result.deploy_id} automatically: {unhealthy.message}")

    def rolled_back(undo: sync.RollbackResult) -> None:
        print_info(
            f"rolled back {', '.join(f.path for f in undo.files)} (recorded as "
            f"{undo.deploy_id}); restarting again"
        )

    hooks = release.ReleaseHooks(
        lambda: restart_with_progress(transport, host, quiet=as_json), rolling_back, rolled_back
    )
    outcome = release.restart_or_roll_back(
        transport, host, result.deploy_id, hooks, roll_back=not no_rollback
    )
    # --json: the deploy, its failed health and any automatic rollback
    release.raise_unless_healthy(result, outcome, logs_shown=True)


def _restart_or_report(transport, host: HostConfig, result, as_json: bool):
    """Restart after a rollback; when health never comes, `--json` still gets the rollback
    with the failed health result in it."""

    try:
        return restart_with_progress(transport, host, quiet=as_json)
    except UnhealthyError as err:
        result.health = err.health
        raise release.with_result(err, result) from None


def render_push(result: sync.PushResult) -> None:
    title = f"push to {result.host}" + (" (dry run: nothing changed)" if result.dry_run else "")
    print_table(
        title,
        [
            Column("action", STATUS),
            Column("status", STATUS),
            Column("live", HASH),
            Column("workspace", HASH),
            Column("path", PATH),
        ],
        [(f.action, f.status, f.old_sha256, f.new_sha256, f.path) for f in result.files],
    )
    n = len(result.uploads)
    if result.dry_run:
        print_info(
            f"would upload {n} file(s)"
            + (f", refuse {len(result.refused)}" if result.refused else "")
        )
    elif result.deploy_id:
        print_info(f"deployed {len(result.deployed)} file(s) as {result.deploy_id}")
        print_info(f"Deployed: {printable_list(result.deployed)}")
    else:
        print_info(_nothing_to_push(result))


def _nothing_to_push(result: sync.PushResult) -> str:
    """Why a push uploaded nothing, without claiming the workspace matches when it is empty."""
    absent = [f for f in result.files if f.status == drift.NOT_PULLED]
    if not result.files:
        return "nothing to push: no configured file exists on the host or in the workspace"
    if len(absent) == len(result.files):
        return "nothing to push: the workspace has none of these files; run `kerneldev pull` first"
    if absent:
        return (
            f"nothing to push: live already has the workspace's bytes for "
            f"{len(result.files) - len(absent)} file(s); {len(absent)} not in the workspace "
            "(`kerneldev pull` them)"
        )
    return "nothing to push: live already has the workspace's bytes"


# --- rollback ---------------------------------------------------------------------------


def rollback_command(
    ctx: typer.Context,
    force: bool = flag("--force", help="Restore even files changed on the host since the deploy."),
    to: str | None = typer.Option(
        None,
        "--to",
        metavar="ID",
        help="Put every file changed since deploy ID back to its bytes right after ID "
        "(ids from `kerneldev log`; a unique prefix is enough).",
    ),
    dry_run: bool = flag("--dry-run", "-n", help="Show what would be restored; change nothing."),
    restart: bool = flag("--restart", help="Restart the service after the rollback."),
    no_import_check: bool = NO_IMPORT_CHECK_OPTION,
    break_lock: bool = BREAK_LOCK_OPTION,
    lock_wait: float = LOCK_WAIT_OPTION,
    parallel: int = PARALLEL_OPTION,
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Put back the files replaced by the last deploy (anyone's, from the host's history);
    a second rollback re-applies it."""
    _, hosts = load_hosts(ctx, host_name)
    if len(hosts) > 1:
        from kerneldev.cli.commands import group as group_cmd
        from kerneldev.loop import fleet_ops

        request = fleet_ops.RollbackRequest(
            force=force,
            to=to,
            dry_run=dry_run,
            restart=restart,
            import_check=not no_import_check,
            break_lock=break_lock,
            lock_wait=lock_wait,
        )
        return group_cmd.rollback(hosts, request, parallel, as_json)
    host = hosts[0]
    if restart and not dry_run:
        require_service(host.service, host.name)
    result = None
    with (
        _open(host) as transport,
        _summary_on_interrupt(lambda: [f.path for f in result.files] if result else None),
    ):
        lock = None if dry_run else locked(transport, host, "rollback", break_lock, lock_wait)
        try:
            result = sync.rollback(
                transport,
                host,
                force=force,
                on_progress=_progress("restoring"),
                to=to,
                dry_run=dry_run,
                import_check=not (no_import_check or dry_run),
            )
            for note in result.notes:
                print_warning(note)
            if not as_json:
                _render_rollback(result)
                render_import_check(result.import_check)
            if restart and not dry_run:
                result.health = _restart_or_report(transport, host, result, as_json)
        finally:
            if lock is not None:
                lock.release()
    if as_json:
        print_json(result)


def _render_rollback(result: sync.RollbackResult) -> None:
    if result.dry_run:
        print_table(
            f"rollback of {result.rolls_back} on {result.host} (dry run: nothing changed)",
            [Column("restore", HASH), Column("replace", HASH), Column("path", PATH)],
            [(r.restore_sha256 or "(remove)", r.live_sha256, r.path) for r in result.plan],
        )
        print_info(f"would restore {len(result.plan)} file(s)")
        return
    print_table(
        f"rollback of {result.rolls_back} on {result.host}",
        [Column("restored", HASH), Column("replaced", HASH), Column("path", PATH)],
        [(f.new_sha256 or "(removed)", f.old_sha256, f.path) for f in result.files],
    )
    if result.deploy_id:
        print_info(f"recorded as deploy {result.deploy_id}")
    else:
        print_info("nothing to restore: the files already are as they were after that deploy")


# --- log --------------------------------------------------------------------------------


def log_command(
    ctx: typer.Context,
    limit: int = typer.Option(
        20, "--limit", "-n", metavar="N", min=0, help="Show the last N deploys (0: all)."
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """List the host's deploys (everyone's): id, time, who, files, old/new sha, outcome, and
    whether each file's deployed bytes are still live."""
    host = load_host(ctx, host_name)
    with _open(host) as transport:
        entries = sync.deploy_log(transport, host)
        _report_leftovers(transport, host)
    if limit > 0:
        entries = entries[-limit:]
    if as_json:
        print_json(entries)
        return
    rows = []
    for e in entries:
        for i, f in enumerate(e.files or [None]):
            head = (e.id, e.time, e.user, f"{e.kind}/{e.outcome}") if i == 0 else ("", "", "", "")
            if f is None:
                rows.append((*head, None, None, "-", "(no files)"))
                continue
            live = "yes" if f.live else "no"
            new = f.new_sha256 or "(removed)"
            rows.append((*head, f.old_sha256 or "(none)", new, live, f.path))
    print_table(
        f"deploys on {host.name}",
        [
            "id",
            Column("time", drop_order=1),  # the id starts with the time
            Column("who", drop_order=2),
            "kind",
            Column("old", HASH, drop_order=3),
            Column("new", HASH, drop_order=4),
            "live",
            Column("path", PATH),
        ],  # fmt: skip
        rows,
    )


def render_import_check(report) -> None:
    """One line per import check that ran (the details are in --json)."""
    if report is None or report.scan is None or not report.scan.modules:
        return
    scan = report.scan
    print_info(
        f"import scan: {scan.scanned} live file(s) read, {len(scan.importers)} import the "
        f"pushed module(s), no name missing"
    )
    for note in scan.notes:
        print_info(f"import scan: {note}")
    if report.after_upload is not None:
        print_info(f"import check: {report.after_upload.command}: ok")


def register(app: typer.Typer) -> None:
    app.command("pull", short_help="Copy the live files into the workspace (what changed).")(
        pull_command
    )
    app.command("diff")(diff_command)
    app.command("push", short_help="Upload the edited files: atomic, backed up, recorded.")(
        push_command
    )
    app.command("rollback", short_help="Put back the files the last deploy replaced.")(
        rollback_command
    )
    app.command("log", short_help="List the host's deploys: id, time, who, files, outcome.")(
        log_command
    )
