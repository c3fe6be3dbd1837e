"""`kerneldev session list|status|stop`: the kept sessions of this user.

`list` is one short row per host (it fits 80 columns); `status` shows every field of each
host's session, its socket and log paths included; `--json` of both carries every field. The
work is `kerneldev.hosts.transport.session.control`; this module parses and renders."""

from __future__ import annotations

import typer

from kerneldev.cli import environment
from kerneldev.cli.common import JSON_OPTION, config_path, flag
from kerneldev.cli.output import (
    NUMBER,
    STATUS,
    TEXT,
    Column,
    print_info,
    print_json,
    print_line,
    print_table,
    wrap_path,
)
from kerneldev.errors import UsageError
from kerneldev.printable import printable

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
# `stop` ends work in progress, so without --host it takes the host (or group) every other
# command would choose, not every host: --all says that.
STOP_HOSTS_OPTION = typer.Option(
    None,
    "--host",
    metavar="NAME|GROUP|LIST",
    help="A host, a group or a comma list of them (default: the host or group other "
    "commands choose; --all for every host of the config).",
    show_default=False,
)


def register(app: typer.Typer) -> None:
    app.add_typer(session_app, short_help="The kept sessions: one connection per host, reused.")


def _hosts(ctx: typer.Context, host_spec: str | None, every: bool):
    from kerneldev.config import load_config

    config = load_config(config_path(ctx))
    if every or host_spec is None:
        return list(config.hosts.values())
    return config.hosts_for(host_spec)


def _statuses(ctx: typer.Context, host_spec: str | None, as_json: bool) -> list | None:
    """The hosts' session statuses for `list` and `status` to render; None once `--json` has
    printed them (the same object for both commands)."""
    from kerneldev.hosts.transport.session import control

    statuses = [control.status(h) for h in _hosts(ctx, host_spec, every=False)]
    if as_json:
        print_json({"sessions": statuses})
        return None
    return statuses


def _showing_command(name: str, show, short: str, doc: str) -> None:
    """Register `session list` or `session status`: one signature, two renderings of the same
    statuses (their `--json` is the same object)."""

    def command(
        ctx: typer.Context,
        host_spec: str | None = HOSTS_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        statuses = _statuses(ctx, host_spec, as_json)
        if statuses is not None:
            show(statuses)

    command.__doc__ = doc
    session_app.command(name, short_help=short)(command)


def _show_rows(statuses: list) -> None:
    render(statuses)


def _show_details(statuses: list) -> None:
    for s in statuses:
        render_detail(s)


_showing_command(
    "list",
    _show_rows,
    "One row per host: alive, pid, age, idle, commands served.",
    """One row per host: session alive, pid, age of its connection, idle time, commands
    served (`session status` adds the socket and log).""",
)
_showing_command(
    "status",
    _show_details,
    "Each host's kept session in full, its socket and log too.",
    """Each host's kept session in full: connection, idle and age limits, clients, socket
    and log.""",
)


@session_app.command("stop", short_help="End the kept session of the host, a group or --all.")
def stop_command(
    ctx: typer.Context,
    host_spec: str | None = STOP_HOSTS_OPTION,
    every: bool = flag("--all", help="Stop the sessions of every host of the config."),
    as_json: bool = JSON_OPTION,
) -> None:
    """End the kept session of the host (a group's hosts, or with --all every host): its
    connection closes, and requests still running through it are ended on the host."""
    from kerneldev.hosts.transport.session import control

    if every and host_spec is not None:
        raise UsageError("--all and --host exclude each other", hint="give one of them")
    if not every and host_spec is None:
        from kerneldev.config import load_config

        hosts = load_config(config_path(ctx)).hosts_for(None)
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


def _state(s) -> str:
    if s.alive:
        return "stopped" if s.stopped else "alive"
    return "none" if s.keep else "off"


def render(statuses) -> None:
    rows = [
        (s.host, _state(s), s.pid, _seconds(s.connection_age), _seconds(s.idle), s.served)
        for s in statuses
    ]
    print_table(
        None,
        [
            Column("host"),
            Column("session", STATUS),
            Column("pid", TEXT),
            Column("age", TEXT),
            Column("idle", TEXT),
            Column("served", NUMBER),
        ],
        rows,
        styles={"alive": "green", "stopped": "yellow", "none": "dim", "off": "dim"},
    )
    for s in statuses:
        if s.stopped:
            print_info(_stopped_note(s))


def _stopped_note(s) -> str:
    return (
        f"{s.host}: the session's holder (pid {s.pid}) is stopped: commands connect without "
        f"it until `kill -CONT {s.pid}`, or end it with `kerneldev session stop --host {s.host}`"
    )


def render_detail(s) -> None:
    """`host: state` then one indented `what: value` line each; on a terminal a path too
    long for its line is wrapped at `/` under itself. A stopped holder answers nothing: its
    state, pid, socket and log, and what to do."""
    state = _state(s)
    if s.alive:
        state += f", pid {s.pid}" + (f", retiring: {s.retiring}" if s.retiring else "")
    elif not s.keep:
        state += " (sessions are turned off for this host)"
    print_line(f"{s.host}: {state}")
    if s.stopped:
        print_info(_stopped_note(s))
    fields: list[tuple[str, str | None]] = []
    if s.alive and not s.stopped:
        fields += [
            ("address", s.address),
            ("connected", f"{_seconds(s.connection_age)} ago, renewed after {_seconds(s.max_age)}"),
            ("idle", f"{_seconds(s.idle)} of {_seconds(s.idle_limit)}"),
            ("commands", f"{s.clients} connected, {s.served} served, {s.running} running"),
        ]
    if s.alive:
        fields.append(("socket", printable(s.socket) if s.socket else None))
    fields.append(("log", printable(s.log) if s.log else None))  # a newline in a path: escaped
    _print_fields(fields)


def _print_fields(fields: list[tuple[str, str | None]]) -> None:
    env = environment.current()
    width = env.out_console.width if env.stdout_isatty else 0
    for what, value in fields:
        if value is None:
            continue
        head = f"  {what + ':':<11}"
        if width and what in ("socket", "log") and len(head) + len(value) > width:
            value = wrap_path(value, width - len(head)).replace("\n", "\n" + " " * len(head))
        print_line(head + value)


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f}s"
