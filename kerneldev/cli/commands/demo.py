"""`kerneldev demo`: the whole loop against a sandbox host on this machine."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

import typer

from kerneldev.cli.common import JSON_OPTION, flag
from kerneldev.cli.output import out_console, print_info, print_json, print_warning
from kerneldev.errors import ExitCode

DIR_OPTION = typer.Option(
    None,
    "--dir",
    metavar="DIR",
    help="Build the sandbox in this new or empty folder (default: a temporary folder).",
)


def demo_command(
    folder: Path | None = DIR_OPTION,
    keep: bool = flag("--keep", help="Keep the sandbox's files afterwards."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run pull, diff, edit, push, restart, drift detection and rollback on a sandbox host."""
    from rich.markup import escape

    from kerneldev.sandbox import demo  # the sandbox and paramiko: only when the demo runs

    # A plain `kill` must still stop the sandbox's sshd and fake service: turn SIGTERM into
    # SystemExit so the demo's clean-up (a `finally`) runs.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(128 + signal.SIGTERM)))
    show = not as_json

    def on_start(sandbox) -> None:
        if not show:
            return
        where = (
            f"ssh to a private sshd on 127.0.0.1:{sandbox.sshd.port}"
            if sandbox.sshd
            else "the local transport"
        )
        print_info(f"sandbox in {sandbox.dir}, host '{sandbox.host_name}' via {where}")
        for note in sandbox.notes:
            print_warning(note)

    def on_step(step) -> None:
        if not show:
            return
        if step.skipped:
            mark = "[yellow]SKIPPED[/]"
        else:
            mark = "[green]ok[/]" if step.ok else "[bold red]FAILED[/]"
        out_console.print(
            f"{mark}  [bold]{escape(step.name)}[/]  [dim]({step.seconds:.1f}s)[/]", soft_wrap=True
        )
        plain = {"markup": False, "highlight": False, "soft_wrap": True}
        out_console.print(f"     expected: {step.expected}", **plain)
        out_console.print(f"     observed: {step.observed}", **plain)
        for line in step.details:
            out_console.print(f"       {line}", style="dim", **plain)

    try:
        result = demo.run_demo(folder, keep=keep, on_step=on_step, on_start=on_start)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        print_json(result)
    else:
        passed = sum(s.ok and not s.skipped for s in result.steps)
        skipped = [s for s in result.steps if s.skipped]
        ran = len(result.steps) - len(skipped)
        verdict = "[green]PASSED[/]" if result.ok else "[bold red]FAILED[/]"
        out_console.print(
            f"\ndemo {verdict}: {passed}/{ran} steps behaved as expected "
            + (f"({len(skipped)} SKIPPED: could not run here) " if skipped else "")
            + f"in {result.seconds:.1f}s ({result.transport} transport)",
            soft_wrap=True,
        )
        if keep:
            d = shlex.quote(result.dir)
            print_info(
                f"sandbox kept in {result.dir}; its sshd and service are stopped. Explore it: "
                f"`kerneldev sandbox up --dir {d}`, then "
                f"`kerneldev --config {shlex.quote(str(Path(result.dir) / 'hosts.yaml'))} diff`; "
                f"stop it with `kerneldev sandbox down --dir {d}`"
            )
    if not result.ok:
        raise typer.Exit(int(ExitCode.FAILURE))


def register(app: typer.Typer) -> None:
    app.command("demo", short_help="Run the whole loop against a sandbox host on this machine.")(
        demo_command
    )
