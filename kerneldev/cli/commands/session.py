"""`kerneldev session list` and `kerneldev session stop`: the kept sessions of this user.

The work is `kerneldev.hosts.transport.session.control`; this module parses and renders."""

from __future__ import annotations

import typer

from kerneldev.cli.common import JSON_OPTION, config_path, flag
from kerneldev.cli.output import PATH, STATUS, TEXT, Column, print_info, print_json, print_table
from kerneldev.errors import UsageError

session_app = typer.Typer(
    name="session",
    help="The kept sessions: one background connection per host that later commands reuse.",
    no_args_is_help=True,
)

HOSTS_OPTION = typer.Option(
    None,
    "--host",
    metavar="NAME|GROUP|LIST",
    help="A host, a group or a comma list of them (default: every host of the config).",
    show_default=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(session_app)


def _hosts(ctx: typer.Context, host_spec: str | None, every: bool):
    from kerneldev.config import load_config

    config = load_config(config_path(ctx))
    if every or host_spec is None:
        return list(config.hosts.values())
    return config.hosts_for(host_spec)


@session_app.command("status")  # the same command under the name `kerneldev status` suggests
@session_app.command("list")
def list_command(
    ctx: typer.Context,
    host_spec: str | None = HOSTS_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Each host's kept session: alive, pid, age of its connection, idle time, socket."""
    from kerneldev.hosts.transport.session import control

    statuses = [control.status(h) for h in _hosts(ctx, host_spec, every=False)]
    if as_json:
        print_json({"sessions": statuses})
        return
    render(statuses)


@session_app.command("stop")
def stop_command(
    ctx: typer.Context,
    host_spec: str | None = HOSTS_OPTION,
    every: bool = flag("--all", help="Stop the sessions of every host of the config."),
    as_json: bool = JSON_OPTION,
) -> None:
    """End the kept session of the host (or of every host): its connection closes, and
    requests still running through it are ended on the host."""
    from kerneldev.hosts.transport.session import control

    if every and host_spec is not None:
        raise UsageError("--all and --host exclude each other", hint="give one of them")
    if not every and host_spec is None:
        from kerneldev.config import load_config

        hosts = [load_config(config_path(ctx)).host(None)]
    else:
        hosts = _hosts(ctx, host_spec, every)
    stopped = [control.stop(h) for h in hosts]
    if as_json:
        print_json({"stopped": [s.host for s in stopped if s.alive], "sessions": stopped})
        return
    for s in stopped:
        if s.alive:
            print_info(f"{s.host}: stopped the session (pid {s.pid})")
        else:
            print_info(f"{s.host}: no kept session")


def render(statuses) -> None:
    rows = []
    for s in statuses:
        rows.append(
            (
                s.host,
                "alive" if s.alive else ("none" if s.keep else "off"),
                s.pid,
                _seconds(s.connection_age),
                _seconds(s.idle),
                s.socket,
            )
        )
    print_table(
        None,
        [
            Column("host"),
            Column("session", STATUS),
            Column("pid", TEXT),
            Column("age", TEXT),
            Column("idle", TEXT),
            Column("socket", PATH, drop_order=1),
        ],
        rows,
        styles={"alive": "green", "none": "dim", "off": "dim"},
    )


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f}s"
