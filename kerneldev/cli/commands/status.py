"""`kerneldev status` (where each host stands) and `kerneldev doctor` (what is wrong, step by
step, and how to fix it). The work is `kerneldev.diagnose.status` and `kerneldev.diagnose.doctor`;
this module parses, calls them and renders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from kerneldev.cli import environment
from kerneldev.cli.common import JSON_OPTION, PARALLEL_OPTION, config_path
from kerneldev.cli.output import STATUS, TEXT, Column, print_json, print_line, print_table
from kerneldev.printable import printable, printable_list

if TYPE_CHECKING:
    from kerneldev.diagnose.doctor import Check, DoctorReport
    from kerneldev.diagnose.status import HostStatus
    from kerneldev.hosts.gpus import GpuReport

HOSTS_OPTION = typer.Option(
    None,
    "--host",
    metavar="NAME|GROUP|LIST",
    help="A host, a group or a comma list of them (default: $KERNELDEV_HOST, then the host of "
    "the workspace you are in, then the config's `default`, or its only host).",
    show_default=False,
)
TIMEOUT_OPTION = typer.Option(
    5.0,
    "--timeout",
    min=0.1,
    max=3600.0,  # a socket timeout: inf or 1e400 would overflow time_t (a traceback)
    metavar="SECONDS",
    help="Seconds to wait for each host's connection steps.",
)

STYLES = {
    "yes": "green",
    "no": "bold red",
    "matches": "green",
    "changed": "bold red",
    "healthy": "green",
    "unhealthy": "bold red",
    "ok": "green",
    "warn": "yellow",
    "FAIL": "bold red",
    "skip": "dim",
}


def register(app: typer.Typer) -> None:
    app.command("status", short_help="Per host: reachable, last deploy, drift, health, GPUs.")(
        _hosts_command(status)
    )
    app.command("doctor", short_help="Check config, SSH, login, write access, Python, GPUs.")(
        _hosts_command(doctor)
    )


@dataclass(frozen=True)
class HostsQuery:
    """What `status` and `doctor` are both asked: which hosts, how long a connection step may
    take, how many hosts at once, JSON or tables."""

    config_path: str | None
    host_spec: str | None
    timeout: float
    parallel: int
    as_json: bool


def _hosts_command(run: Callable[[HostsQuery], None]) -> Callable[..., None]:
    """The command that runs `run` with the options both take; `run`'s docstring is its help."""

    def command(
        ctx: typer.Context,
        host_spec: str | None = HOSTS_OPTION,
        timeout: float = TIMEOUT_OPTION,
        parallel: int = PARALLEL_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        run(HostsQuery(config_path(ctx), host_spec, timeout, parallel, as_json))

    command.__doc__ = run.__doc__  # not functools.wraps: typer would read run's signature
    return command


# --- status -----------------------------------------------------------------------------


def status(q: HostsQuery) -> None:
    """Per host: reachable, last deploy, live files vs that deploy, service health, GPUs.
    Exit 0 all fine, 1 a host has a problem, 3 a host is unreachable (the worst host wins)."""
    from kerneldev import interrupt
    from kerneldev.config import load_config
    from kerneldev.diagnose import status as host_status

    hosts = load_config(q.config_path).hosts_for(q.host_spec)
    try:
        statuses = host_status.collect_status(hosts, connect_timeout=q.timeout, parallel=q.parallel)
    except interrupt.Interrupted as err:
        # Ctrl-C: what was collected is still shown (--json: in the error's JSON document,
        # marked "interrupted"), then the command ends as interrupted (130).
        if isinstance(err.report, list):
            collected = err.report
            err.report = _status_json(collected, int(err.exit_code), interrupted=True)
            if not q.as_json:
                render_status(collected)
        raise
    code = host_status.worst_exit([s.exit_code for s in statuses])
    if q.as_json:
        print_json(_status_json(statuses, int(code)))
    else:
        render_status(statuses)
    if code:
        raise typer.Exit(int(code))


def _status_json(statuses: list[HostStatus], code: int, interrupted: bool = False) -> dict:
    return {
        "hosts": [s.as_json() for s in statuses],
        "exit_code": code,
        "interrupted": interrupted,
    }


def render_status(statuses: list[HostStatus]) -> None:
    """One row per host (80 columns), then a line per thing worth saying about a host."""
    rows = []
    for s in statuses:
        deploy = s.last_deploy
        live = None if s.live_matches is None else ("matches" if s.live_matches else "changed")
        service = None if s.service is None else ("healthy" if s.service.healthy else "unhealthy")
        rows.append(
            (
                s.host,
                "yes" if s.reachable else ("?" if s.interrupted else "no"),
                _short_time(deploy.time) if deploy else None,
                deploy.user if deploy else None,
                live,
                service,
                gpu_summary(s.gpus) if s.gpus else None,
            )
        )
    print_table(
        None,
        [
            Column("host"),
            Column("reach", STATUS),
            Column("deployed", TEXT),
            Column("by", TEXT, drop_order=1),
            Column("live", STATUS),
            Column("service", STATUS),
            Column("gpus", TEXT),
        ],
        rows,
        styles=STYLES,
    )
    env = environment.current()
    for s in statuses:
        for line in _status_lines(s):
            if env.stdout_isatty:  # wrapped at the terminal's width, never read as markup
                env.out_console.print(f"{s.host}: {line}", markup=False, highlight=False)
            else:  # one line each, for grep
                print_line(f"{s.host}: {line}")


def _status_lines(s: HostStatus) -> list[str]:
    if not s.reachable and s.unreachable is not None:
        hint = f" (hint: {s.unreachable.hint})" if s.unreachable.hint else ""
        return [f"unreachable: {s.unreachable.message}{hint}"]
    if s.interrupted and not s.reachable:  # never looked at: nothing else to say
        return list(s.notes)
    lines = []
    d = s.last_deploy
    if d is not None:
        what = d.kind if d.outcome == "deployed" else f"{d.kind}, {d.outcome}"
        files = printable_list(d.files[:3])
        if len(d.files) > 3:
            files += f" and {len(d.files) - 3} more"
        lines.append(
            f"last deploy {d.id} ({what}) by {d.user} at {d.time}: "
            f"{len(d.files)} file(s){': ' + files if files else ''}"
        )
    elif not s.problems:
        lines.append("no deploy recorded in the host's history")
    for f in s.live:
        if not f.matches:
            now = "gone from the host" if f.live_sha256 is None else f"now {f.live_sha256[:12]}"
            lines.append(
                f"changed since deploy {f.deploy_id}: {printable(f.path)} "
                f"(deployed {f.deployed_sha256[:12] if f.deployed_sha256 else 'removed'}, {now})"
            )
    if s.service is not None and not s.service.healthy:
        lines.append(f"service unhealthy: {s.service.last_check} from {s.service.health}")
    if s.gpus is not None and s.gpus.failed:
        lines.append(s.gpus.note or "nvidia-smi failed")
    for p in s.problems:
        lines.append(p.message + (f" (hint: {p.hint})" if p.hint else ""))
    lines += s.notes
    if s.interrupted and s.reachable:
        lines.append("interrupted: the steps after these were not run")
    if s.session is not None and s.session.stopped:
        k = s.session
        lines.append(
            f"kept session: pid {k.pid} is stopped (commands connect without it): "
            f"`kill -CONT {k.pid}`, or `kerneldev session stop --host {s.host}`"
        )
    elif s.session is not None and s.session.alive:
        k = s.session
        lines.append(
            f"kept session: pid {k.pid}, connected {k.connection_age:.0f}s ago, "
            f"idle {k.idle:.0f}s of {k.idle_limit:g}s, socket {k.socket}"
        )
    return lines


def gpu_summary(report: GpuReport) -> str:
    """`8x H200 12% 40/141G`: count and name per model, mean utilisation, memory used/total."""
    if report.failed:
        return "nvidia-smi failed"
    if not report.present:
        return report.note or "-"
    if not report.gpus:
        return "no GPU"
    parts = []
    names: dict[str, list] = {}
    for g in report.gpus:
        names.setdefault(g.name.removeprefix("NVIDIA ").strip(), []).append(g)
    for name, gpus in names.items():
        text = f"{len(gpus)}x {name}"
        utils = [g.utilization_pct for g in gpus if g.utilization_pct is not None]
        if utils:
            text += f" {round(sum(utils) / len(utils))}%"
        used = [g.memory_used_mib for g in gpus if g.memory_used_mib is not None]
        total = [g.memory_total_mib for g in gpus if g.memory_total_mib is not None]
        if used and total:
            text += f" {round(sum(used) / 1024)}/{round(sum(total) / 1024)}G"
        parts.append(text)
    return ", ".join(parts)


def _short_time(iso: str) -> str:
    """`2026-11-29T18:48:58Z` -> `11-29 18:48` (the full id and time are in the lines below)."""
    if len(iso) >= 16 and iso[4] == "-" and iso[10] == "T":
        return f"{iso[5:10]} {iso[11:16]}"
    return iso


# --- doctor -----------------------------------------------------------------------------


def doctor(q: HostsQuery) -> None:
    """Check config, DNS, port, host key, login, root, files, write access, GPUs, Python,
    torch, triton and service health, one line each with a fix. Exit 1 when a check fails."""
    from kerneldev import interrupt
    from kerneldev.diagnose import doctor

    try:
        report = doctor.diagnose(
            q.config_path, q.host_spec, connect_timeout=q.timeout, parallel=q.parallel
        )
    except interrupt.Interrupted as err:
        # Ctrl-C: the checks that ran are still shown (--json: in the error's JSON document,
        # marked "interrupted"), then the command ends as interrupted (130).
        if isinstance(err.report, doctor.DoctorReport):
            partial = err.report
            err.report = {**partial.as_json(), "exit_code": int(err.exit_code)}
            if not q.as_json:
                render_doctor(partial)
        raise
    if q.as_json:
        print_json(report.as_json())
    else:
        render_doctor(report)
    if report.exit_code:
        raise typer.Exit(int(report.exit_code))


def render_doctor(report: DoctorReport) -> None:
    """One line per check; on a terminal the detail and its fix wrap under themselves."""
    _print_checks([report.config], indent=0)
    for host in report.hosts:
        where = host.address or f"transport: {host.transport}"
        print_line(f"host {host.host} ({where})")
        _print_checks(host.checks, indent=2)
        if host.interrupted:
            print_line("  interrupted: the checks after these were not run")


def _print_checks(checks: list[Check], indent: int) -> None:
    env = environment.current()
    if not env.stdout_isatty:
        for check in checks:
            head = f"{' ' * indent}{check.verdict:<4}  {check.name:<8}  "
            print_line(head + check.detail)
            if check.hint:
                print_line(" " * len(head) + f"fix: {check.hint}")
        return
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, min_width=4)  # the verdict
    grid.add_column(no_wrap=True, min_width=8)  # the check's name
    grid.add_column(overflow="fold")
    for check in checks:
        verdict = Text(check.verdict, style=STYLES.get(check.verdict, ""))
        grid.add_row(verdict, Text(check.name), Text(check.detail))
        if check.hint:
            grid.add_row(Text(""), Text(""), Text(f"fix: {check.hint}", style="dim"))
    env.out_console.print(Padding(grid, (0, 0, 0, indent)))
