"""pull, diff, push, rollback: the loop's commands. Each parses, calls the core, renders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer

from kerneldev import drift, sync
from kerneldev.cli import environment, output
from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, load, load_host
from kerneldev.cli.output import HASH, PATH, STATUS, Column, print_info, print_json, print_warning
from kerneldev.config import HostConfig, remember_config
from kerneldev.errors import ExitCode, UnhealthyError
from kerneldev.service import require_service
from kerneldev.transport import open_transport

PATHS_ARGUMENT = typer.Argument(
    None,
    metavar="PATHS",
    help="Files to act on: workspace paths or paths relative to the host's root "
    "(default: every configured file).",
    show_default=False,
)

NO_IMPORT_CHECK_OPTION = typer.Option(
    False,
    "--no-import-check",
    help="Skip the import checks: the scan of the live tree's imports before the upload and "
    "the import of the pushed modules after it.",
)

STATUS_STYLE = {
    drift.IN_SYNC: "green",
    drift.EDITED: "cyan",
    drift.DRIFTED: "yellow",
    drift.CONFLICT: "bold red",
    drift.NOT_PULLED: "dim",
    drift.MISSING_LIVE: "red",
    drift.MIRROR_SAME: "green",
    drift.MIRROR_DIFFERS: "yellow",
    drift.MIRROR_ABSENT: "dim",
    "upload": "cyan",
    "create": "cyan",
    "refused": "bold red",
    "pulled": "cyan",
    "overwritten": "yellow",
}


def print_table(title: str | None, columns: Sequence[Any], rows: Sequence[Sequence[Any]]) -> None:
    """The loop's tables: `output.print_table` with the status words coloured."""
    output.print_table(title, columns, rows, styles=STATUS_STYLE)


def print_patch(text: str) -> None:
    env = environment.current()
    if env.stdout_isatty:
        from rich.syntax import Syntax

        env.out_console.print(Syntax(text, "diff", theme="ansi_dark", word_wrap=False))
    else:
        env.stdout.write(text)
        env.stdout.flush()


def _short(sha: str | None) -> str | None:
    return sha[:12] if sha else None


def _progress(verb: str):
    """Per-file progress on stderr, only on a terminal."""
    env = environment.current()
    if not env.stderr_isatty:
        return None
    return lambda path: env.err_console.print(f"{verb} {path}", style="dim", markup=False)


def _open(host: HostConfig):
    return open_transport(host)


# --- pull -------------------------------------------------------------------------------


def pull_command(
    ctx: typer.Context,
    paths: list[str] | None = PATHS_ARGUMENT,
    force: bool = typer.Option(
        False, "--force", help="Overwrite workspace files that have unpushed edits."
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Copy the live files from the host into the workspace (only what changed)."""
    config, host = load(ctx, host_name)
    with _open(host) as transport:
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
                print_warning(f"your edits to {f.path} were kept in {f.discarded}")
    for path in result.missing:
        print_warning(f"{path}: not on the host {host.name} under {host.root}")
    if result.missing:
        raise typer.Exit(int(ExitCode.FAILURE))


# --- diff -------------------------------------------------------------------------------


def diff_command(
    ctx: typer.Context,
    paths: list[str] | None = PATHS_ARGUMENT,
    patch: bool = typer.Option(
        False, "--patch", "-p", help="Print unified diffs (live vs workspace, mirror vs live)."
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Compare live, workspace, last sync and mirror. Exit 0 only when all is in sync."""
    host = load_host(ctx, host_name)
    with _open(host) as transport:
        report = drift.compute_drift(transport, host, paths, patch=patch)
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
            print_info(f"{f.path}: {f.note}")


# --- push -------------------------------------------------------------------------------


def push_command(
    ctx: typer.Context,
    paths: list[str] | None = PATHS_ARGUMENT,
    dry_run: bool = typer.Option(
        False, "--dry-run", "-n", help="Show what would be uploaded; change nothing."
    ),
    force: bool = typer.Option(
        False, "--force", help="Upload even files that drifted on the host or conflict."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Restart the service after a successful push."
    ),
    no_import_check: bool = NO_IMPORT_CHECK_OPTION,
    create_root: bool = typer.Option(
        False, "--create-root", help="Create the host's `root` folder when it does not exist."
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Upload the workspace files that differ from live: atomic, backed up, recorded."""
    host = load_host(ctx, host_name)
    if restart and not dry_run:
        require_service(host.service, host.name)  # fail before deploying, not after
    with _open(host) as transport:
        result = sync.push(
            transport,
            host,
            paths,
            force=force,
            dry_run=dry_run,
            on_progress=_progress("uploading"),
            import_check=not no_import_check,
            create_root=create_root,
        )
        if not as_json:
            render_push(result)
            render_import_check(result.import_check)
        if restart and not dry_run:
            result.health = _restart_or_report(transport, host, result, as_json)
    if as_json:
        print_json(result)
    if dry_run and result.refused:
        raise typer.Exit(int(ExitCode.FAILURE))


def _restart_or_report(transport, host: HostConfig, result, as_json: bool):
    """Restart after a push/rollback; when health never comes, `--json` still gets the deploy
    with the failed health result in it."""
    from kerneldev.cli.service_cmd import restart_with_progress

    try:
        return restart_with_progress(transport, host, quiet=as_json)
    except UnhealthyError as err:
        result.health = err.health
        again = UnhealthyError(err.message, err.logs, err.hint, health=err.health)
        again.report = result  # the deploy did happen: --json shows it with the failed health
        raise again from None


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
    force: bool = typer.Option(
        False, "--force", help="Restore even files changed on the host since the deploy."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Restart the service after the rollback."
    ),
    no_import_check: bool = NO_IMPORT_CHECK_OPTION,
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Put back the files replaced by the last deploy (a second rollback re-applies it)."""
    host = load_host(ctx, host_name)
    if restart:
        require_service(host.service, host.name)
    with _open(host) as transport:
        result = sync.rollback(
            transport,
            host,
            force=force,
            on_progress=_progress("restoring"),
            import_check=not no_import_check,
        )
        if not as_json:
            print_table(
                f"rollback of {result.rolls_back} on {result.host}",
                [Column("restored", HASH), Column("replaced", HASH), Column("path", PATH)],
                [(f.new_sha256 or "(removed)", f.old_sha256, f.path) for f in result.files],
            )
            print_info(f"recorded as deploy {result.deploy_id}")
            render_import_check(result.import_check)
        if restart:
            result.health = _restart_or_report(transport, host, result, as_json)
    if as_json:
        print_json(result)


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
    app.command("pull")(pull_command)
    app.command("diff")(diff_command)
    app.command("push")(push_command)
    app.command("rollback")(rollback_command)
