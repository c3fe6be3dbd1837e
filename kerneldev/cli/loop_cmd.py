"""pull, diff, push, rollback: the loop's commands. Each parses, calls the core, renders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
from rich.syntax import Syntax
from rich.table import Table

from kerneldev import drift, sync
from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, load_host
from kerneldev.cli.output import err_console, out_console, print_info, print_json, print_warning
from kerneldev.config import HostConfig
from kerneldev.errors import ExitCode
from kerneldev.service import require_service
from kerneldev.transport import open_transport

PATHS_ARGUMENT = typer.Argument(
    None,
    metavar="PATHS",
    help="Files to act on: workspace paths or paths relative to the host's root "
    "(default: every configured file).",
    show_default=False,
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


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal; aligned plain columns in a pipe (no wrapping, no colour), so
    `grep` and `awk` see one file per line."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    if out_console.is_terminal:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for i, name in enumerate(columns):
            table.add_column(name, no_wrap=(i == len(columns) - 1), overflow="fold")
        for row in cells:
            table.add_row(*(f"[{STATUS_STYLE[c]}]{c}[/]" if c in STATUS_STYLE else c for c in row))
        out_console.print(table)
        return
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print("\n".join(lines), flush=True)


def print_patch(text: str) -> None:
    if out_console.is_terminal:
        out_console.print(Syntax(text, "diff", theme="ansi_dark", word_wrap=False))
    else:
        print(text, end="", flush=True)


def _short(sha: str | None) -> str | None:
    return sha[:12] if sha else None


def _progress(verb: str):
    """Per-file progress on stderr, only on a terminal."""
    if not err_console.is_terminal:
        return None
    return lambda path: err_console.print(f"{verb} {path}", style="dim", markup=False)


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
    host = load_host(ctx, host_name)
    with _open(host) as transport:
        result = sync.pull(transport, host, paths, force=force, on_progress=_progress("pulling"))
    if as_json:
        print_json(result)
    else:
        print_table(
            f"pull from {host.name} into {result.workspace}",
            ["action", "size", "sha256", "path"],
            [(f.action, f.size, _short(f.sha256), f.path) for f in result.files],
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
        ["status", "mirror", "path"],
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
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Upload the workspace files that differ from live: atomic, backed up, recorded."""
    from kerneldev.cli.service_cmd import restart_with_progress

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
        )
        if not as_json:
            render_push(result)
        if restart and not dry_run:
            result.health = restart_with_progress(transport, host, quiet=as_json)
    if as_json:
        print_json(result)
    if dry_run and result.refused:
        raise typer.Exit(int(ExitCode.FAILURE))


def render_push(result: sync.PushResult) -> None:
    title = f"push to {result.host}" + (" (dry run: nothing changed)" if result.dry_run else "")
    print_table(
        title,
        ["action", "status", "live", "workspace", "path"],
        [
            (f.action, f.status, _short(f.old_sha256), _short(f.new_sha256), f.path)
            for f in result.files
        ],
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
        print_info("nothing to push: live already has the workspace's bytes")


# --- rollback ---------------------------------------------------------------------------


def rollback_command(
    ctx: typer.Context,
    force: bool = typer.Option(
        False, "--force", help="Restore even files changed on the host since the deploy."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Restart the service after the rollback."
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Put back the files replaced by the last deploy (a second rollback re-applies it)."""
    from kerneldev.cli.service_cmd import restart_with_progress

    host = load_host(ctx, host_name)
    if restart:
        require_service(host.service, host.name)
    with _open(host) as transport:
        result = sync.rollback(transport, host, force=force, on_progress=_progress("restoring"))
        if not as_json:
            print_table(
                f"rollback of {result.rolls_back} on {result.host}",
                ["restored", "replaced", "path"],
                [
                    (_short(f.new_sha256) or "(removed)", _short(f.old_sha256), f.path)
                    for f in result.files
                ],
            )
            print_info(f"recorded as deploy {result.deploy_id}")
        if restart:
            result.health = restart_with_progress(transport, host, quiet=as_json)
    if as_json:
        print_json(result)


def register(app: typer.Typer) -> None:
    app.command("pull")(pull_command)
    app.command("diff")(diff_command)
    app.command("push")(push_command)
    app.command("rollback")(rollback_command)
