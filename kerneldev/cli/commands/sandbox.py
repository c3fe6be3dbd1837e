"""`kerneldev sandbox up|down|status --dir D`: start, stop and show the sandbox host that
`kerneldev demo --keep --dir D` leaves behind (or a new one), so its hosts.yaml can be used."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from kerneldev.cli.common import JSON_OPTION
from kerneldev.cli.output import print_info, print_json, print_line

# kerneldev.sandbox.host (the sshd, the service launcher, asyncio) is imported by each command,
# not here: `kerneldev --help` and every other command import this module.
if TYPE_CHECKING:
    from kerneldev.sandbox.host import SandboxStatus

app = typer.Typer(
    help="Start, stop or show a sandbox host on this machine (a fake live SGLang tree, a "
    "private sshd on 127.0.0.1 and a fake service).",
    no_args_is_help=True,
)

DIR_OPTION = typer.Option(
    ...,
    "--dir",
    metavar="DIR",
    help="The sandbox folder (`kerneldev demo --keep --dir D` leaves one).",
)


@app.command("up", short_help="Start the sandbox's sshd and fake service.")
def up_command(folder: Path = DIR_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Start the sandbox's sshd and fake service (a new or empty folder gets a new sandbox)."""
    from kerneldev.sandbox.host import sandbox_up

    status = sandbox_up(folder)
    d = shlex.quote(status.dir)
    config = shlex.quote(status.config)
    show(
        status,
        as_json,
        f"try: kerneldev --config {config} pull   (then diff, push --restart, ...)",
        f"stop it with: kerneldev sandbox down --dir {d}",
    )


@app.command("down")
def down_command(folder: Path = DIR_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Stop the sandbox's sshd and fake service; its files stay."""
    from kerneldev.sandbox.host import sandbox_down

    status = sandbox_down(folder)
    show(
        status,
        as_json,
        f"start it again with: kerneldev sandbox up --dir {shlex.quote(status.dir)}; "
        f"remove it with: rm -r {shlex.quote(status.dir)}",
    )


@app.command("status")
def status_command(folder: Path = DIR_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Show whether the sandbox's sshd and fake service run."""
    from kerneldev.sandbox.host import sandbox_status

    show(sandbox_status(folder), as_json)


def show(status: SandboxStatus, as_json: bool, *hints: str) -> None:
    """The status as JSON, or as lines for a reader followed by the hints (what to do next)."""
    if as_json:
        print_json(status)
        return
    render(status)
    for hint in hints:
        print_info(hint)


def render(status: SandboxStatus) -> None:
    what = "created" if status.created else "sandbox"
    print_line(f"{what} {status.dir}: host '{status.host}'")
    print_line(f"  config:  {status.config}")
    if status.sshd_running is None:
        print_line("  sshd:    none (local transport)")
    else:
        state = "running" if status.sshd_running else "stopped"
        print_line(f"  sshd:    {state} on 127.0.0.1:{status.sshd_port}")
    state = "running" if status.service_running else "stopped"
    print_line(f"  service: {state}, health {status.service_health}")
    for note in status.notes:
        print_info(f"note: {note}")


def register(root: typer.Typer) -> None:
    root.add_typer(
        app, name="sandbox", short_help="Start, stop or show a sandbox host on this machine."
    )
