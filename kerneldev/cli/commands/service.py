"""`kerneldev restart`: restart the service and wait for health, with a spinner on a terminal."""

from __future__ import annotations

import typer

from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, PARALLEL_OPTION, flag, load_hosts
from kerneldev.cli.host_steps import locked, restart_with_progress
from kerneldev.cli.output import print_json
from kerneldev.errors import RemoteCommandError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.base import Transport
from kerneldev.service import restart as service_core


def restart_command(
    ctx: typer.Context,
    break_lock: bool = flag(
        "--break-lock", help="Remove the host's lock even if its holder may still run."
    ),
    lock_wait: float = typer.Option(
        60.0, "--lock-wait", metavar="SECONDS", min=0, help="How long to wait for the host's lock."
    ),
    parallel: int = PARALLEL_OPTION,
    serial: int | None = typer.Option(
        None,
        "--serial",
        min=1,
        metavar="N",
        help="With a group: restart in waves of N hosts; the first wave with a host that does "
        "not become healthy stops the rest (default: all hosts at once, up to --parallel).",
        show_default=False,
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Run the service's restart command on the host and wait until it is healthy."""
    _, hosts = load_hosts(ctx, host_name)
    if len(hosts) > 1:
        from kerneldev.cli.commands import group as group_cmd

        return group_cmd.restart(hosts, break_lock, lock_wait, parallel, serial, as_json)
    host = hosts[0]
    service_core.require_service(host.service, host.name)
    with open_transport(host) as transport:
        _connect(transport)  # say "restarting" only once the host answered
        lock = locked(transport, host, "restart", break_lock, lock_wait)
        try:
            health = restart_with_progress(transport, host, quiet=as_json)
        finally:
            lock.release()
    if as_json:
        print_json(health)


def _connect(transport: Transport) -> None:
    """Open the connection now (transports connect on first use): a host that cannot be
    reached fails here, before any "restarting" line."""
    try:
        transport.run("true", timeout=30)
    except RemoteCommandError:
        pass  # reached, but `true` timed out: the restart itself will say more


def register(app: typer.Typer) -> None:
    app.command("restart", short_help="Restart the service and wait until it is healthy.")(
        restart_command
    )
