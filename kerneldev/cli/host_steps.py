"""What several commands do on a live host: show the loop's status tables and patches, take
the host's lock, restart the service with progress, say that a late Ctrl-C cut nothing.
Commands import these from here rather than from one another."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kerneldev import interrupt
from kerneldev.cli import environment, output
from kerneldev.cli.output import err_console, print_info, print_warning
from kerneldev.config import HostConfig
from kerneldev.hosts.transport.base import Transport
from kerneldev.loop import drift
from kerneldev.loop import lock as host_lock
from kerneldev.service import restart as service_core

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

        env.out_console.print(Syntax(text, "diff", theme="ansi_dark", word_wrap=True))
    else:
        env.stdout.write(text)
        env.stdout.flush()


def locked(
    transport: Transport,
    host: HostConfig,
    command: str,
    break_lock: bool,
    wait: float,
    create_root: bool = False,
    defer: bool = False,
) -> host_lock.HostLock:
    """`host_lock.lock_for`, its wait and notes said on stderr."""
    return host_lock.lock_for(
        transport, host.root, command, wait=wait, break_lock=break_lock,
        say=print_info, warn=print_warning, where=f" on {host.name}",
        create_root=create_root, defer=defer,
    )  # fmt: skip


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


def print_service_logs(err: service_core.UnhealthyError, command: str | None) -> None:
    """The logs an UnhealthyError carries, on stderr (its hint says they are shown above): in a
    pipe each line whole, as the service wrote it (for grep); on a terminal wrapped at spaces
    or after a `/`, never inside a name where it can be helped."""
    if not err.logs:
        return
    env = environment.current()
    title, logs = f"service logs ({command})", err.logs.rstrip("\n")
    if not env.stderr_isatty:
        env.stderr.write(f"--- {title} ---\n{logs}\n--- end of {title} ---\n")
        env.stderr.flush()
        return
    from rich.markup import escape

    err_console.rule(escape(title))
    text = output.wrap_block(logs, err_console.width)
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)
    err_console.rule()


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
        print_service_logs(err, svc.logs)
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


def note_late_ctrl_c(after: str) -> None:
    """A Ctrl-C that came once the work had ended (its record and unlock are shielded) cut
    nothing short: taken here, so the command exits as the work did, and said."""
    if interrupt.consume() is not None:
        print_info(f"Ctrl-C came after {after}; nothing was interrupted")
