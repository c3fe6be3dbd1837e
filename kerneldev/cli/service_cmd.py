"""`kerneldev restart`: restart the service and wait for health, with a spinner on a terminal."""

from __future__ import annotations

import time

import typer

from kerneldev import service as service_core
from kerneldev.cli.common import HOST_OPTION, JSON_OPTION, load_host
from kerneldev.cli.output import err_console, print_info, print_json
from kerneldev.config import HostConfig
from kerneldev.errors import RemoteCommandError
from kerneldev.transport import open_transport
from kerneldev.transport.base import Transport


class _Elapsed:
    """Spinner text whose elapsed seconds are recomputed at every refresh, not only when a
    health check returns."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.last: str | None = None
        self.start = time.monotonic()

    def __rich__(self):
        from rich.text import Text

        text = f"{self.label}: {time.monotonic() - self.start:.0f}s"
        return Text(text + (f", last check: {self.last}" if self.last else ""))


def restart_with_progress(
    transport: Transport, host: HostConfig, *, quiet: bool = False
) -> service_core.ServiceHealth:
    """Restart and wait; a spinner with elapsed time on a terminal, plain lines otherwise.
    On a health timeout the service logs go to stderr before the error propagates."""
    svc = service_core.require_service(host.service, host.name)
    what = svc.health or "no health check"
    status = None
    if err_console.is_terminal:
        progress = _Elapsed(f"restarting {host.name}: {svc.restart}")
        status = err_console.status(progress)
        status.start()

        def on_tick(elapsed: float, last: str | None) -> None:
            progress.label = f"waiting for health of {host.name} ({what})"
            progress.last = last

    else:
        on_tick = None
        if not quiet:
            print_info(f"restarting {host.name}: {svc.restart}; waiting for {what}")
    try:
        health = service_core.restart(transport, svc, on_tick=on_tick)
    except service_core.UnhealthyError as err:
        if status is not None:
            status.stop()
            status = None
        if err.logs:
            from rich.markup import escape

            err_console.rule(escape(f"service logs ({svc.logs})"))
            err_console.print(err.logs.rstrip("\n"), markup=False, highlight=False)
            err_console.rule()
        raise
    finally:
        if status is not None:
            status.stop()
    if not quiet:
        print_info(
            f"{host.name} is healthy after {health.elapsed:.1f}s ({health.last_check})"
            if health.health
            else f"{host.name} restarted (no health check configured)"
        )
    return health


def restart_command(
    ctx: typer.Context,
    break_lock: bool = typer.Option(
        False, "--break-lock", help="Remove the host's lock even if its holder may still run."
    ),
    lock_wait: float = typer.Option(
        60.0, "--lock-wait", metavar="SECONDS", help="How long to wait for the host's lock."
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Run the service's restart command on the host and wait until it is healthy."""
    from kerneldev.cli.loop_cmd import locked

    host = load_host(ctx, host_name)
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
    app.command("restart")(restart_command)
