"""The loop's commands on several hosts (`--host GROUP` or `--host a,b`): a live per-host view
while they run, then a per-host summary table (or `--json` with one entry per host) and the
worst host's exit code. The work is in `kerneldev.loop.fleet_ops`; this module only renders.

With one host the commands never come here: their output stays the single-host one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import typer

from kerneldev.cli import environment
from kerneldev.cli.host_steps import note_late_ctrl_c, print_service_logs, print_table
from kerneldev.cli.output import (
    GAP,
    PATH,
    STATUS,
    WORDS,
    Column,
    print_error,
    print_info,
    print_json,
    print_line,
    print_warning,
    to_jsonable,
)
from kerneldev.config import Config, HostConfig
from kerneldev.errors import BenchError, ExitCode, KerneldevError, UsageError
from kerneldev.hosts import fleet
from kerneldev.hosts.fleet import HostEvent, HostOutcome, OutcomeStatus
from kerneldev.loop import fleet_ops
from kerneldev.printable import printable_list

OUTCOME_STYLE = {
    OutcomeStatus.OK: "green",
    OutcomeStatus.FAILED: "bold red",
    OutcomeStatus.USAGE: "bold red",
    OutcomeStatus.UNREACHABLE: "bold red",
    OutcomeStatus.INTERRUPTED: "yellow",
    OutcomeStatus.SKIPPED: "dim",
    "running": "cyan",
    "done": "green",
    "waiting": "dim",
    fleet_ops.LiveMatch.SAME: "green",
    fleet_ops.LiveMatch.DIFFERS: "yellow",
    fleet_ops.LiveMatch.MISSING: "red",
}


# --- the live view ----------------------------------------------------------------------


class HostsView:
    """Per-host progress on stderr: a live table on a terminal (host, state, last message,
    time), plain `host: ...` lines at start and end otherwise."""

    def __init__(self, hosts: Sequence[HostConfig]) -> None:
        self.names = [h.name for h in hosts]
        self.state = dict.fromkeys(self.names, "waiting")
        self.text: dict[str, str] = dict.fromkeys(self.names, "")
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        env = environment.current()
        self.terminal = bool(env.stderr_isatty)
        self.live = None

    def __rich_console__(self, console, options):
        from rich import box
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        rows = []
        for name in self.names:
            start = self.started.get(name)
            took = "" if start is None else f"{self.ended.get(name, now) - start:.0f}s"
            rows.append((name, self.state[name], took, self.text[name]))
        # Host, state and time keep their whole width; the last message alone is cut to what
        # is left (rich squeezed every column, the host's to nothing, at 80 columns).
        widths = [
            max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(("host", "state", "time"))
        ]
        room = max(options.max_width - sum(widths) - 3 * GAP, 8)
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for name, width in zip(("host", "state", "time"), widths, strict=True):
            table.add_column(name, no_wrap=True, min_width=width)
        table.add_column("last", no_wrap=True, max_width=room)
        for name, state, took, last in rows:
            text = Text(last)
            text.truncate(room, overflow="ellipsis")
            table.add_row(
                Text(name), Text(state, style=OUTCOME_STYLE.get(state, "")), Text(took), text
            )
        yield table

    def __enter__(self) -> HostsView:
        if self.terminal:
            from rich.live import Live

            env = environment.current()
            self.live = Live(self, console=env.err_console, refresh_per_second=4, transient=True)
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def on_wave(self, number: int, wave: list[HostConfig]) -> None:
        text = f"wave {number}: {', '.join(h.name for h in wave)}"
        if self.live is not None:
            self.live.console.print(text, markup=False, highlight=False)
        else:
            print_info(text)

    def __call__(self, event: HostEvent) -> None:
        name = event.host
        if event.kind == "started":
            self.state[name] = "running"
            self.started[name] = time.monotonic()
            if self.live is None:
                print_info(f"{name}: started")
        elif event.kind == "progress":
            self.text[name] = event.text or ""
        elif event.kind == "warning":
            self.text[name] = event.text or ""
            print_warning(f"{name}: {event.text}")  # the live view's console: printed above it
        elif event.kind == "done" and event.outcome is not None:
            o = event.outcome
            # "done", not "ok": a command may still judge the result (diff across hosts).
            self.state[name] = "done" if o.ok else o.status
            self.ended[name] = time.monotonic()
            self.text[name] = _first_line(o.message) if o.message else ""
            if self.live is None:
                tail = f": {_first_line(o.message)}" if o.message else ""
                print_info(f"{name}: {self.state[name]} ({o.elapsed:.1f}s){tail}")


def host_heading(name: str) -> None:
    """`NAME:` on stdout above a host's own table or patches, so that the output saved from a
    group command still says whose they are (a patch tool skips the line)."""
    print_line(f"{name}:")


def _first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0]


# --- choosing the hosts -------------------------------------------------------------------


def reference_host(hosts: Sequence[HostConfig], name: str | None) -> HostConfig:
    """`--from NAME`, which must be one of the hosts; default the first."""
    if name is None:
        return hosts[0]
    for h in hosts:
        if h.name == name:
            return h
    raise UsageError(
        f"--from {name}: not one of the hosts this command works on "
        f"({', '.join(h.name for h in hosts)})",
        hint="name one of the group's hosts",
    )


# --- the result -------------------------------------------------------------------------


def outcome_json(o: HostOutcome, result: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """One host's entry in `--json`: its status and exit code, the single-host result object
    (or the partial one of its error), and the error."""
    error = None
    if o.error is not None:
        error = {
            "code": o.exit_code,
            "type": type(o.error).__name__ if o.status != OutcomeStatus.SKIPPED else "Skipped",
            "message": o.error.message,
            "hint": o.error.hint,
        }
    value = o.result
    if value is not None and result is not None:
        value = result(value)
    return {
        "host": o.host,
        "status": o.status,
        "exit_code": o.exit_code,
        "elapsed": round(o.elapsed, 3),
        "result": to_jsonable(value),
        "error": error,
    }


def finish(
    command: str,
    outcomes: list[HostOutcome],
    as_json: bool,
    describe: Callable[[HostOutcome], str],
    *,
    result_json: Callable[[Any], Any] | None = None,
    extra: dict[str, Any] | None = None,
    judged: bool = False,
    stands_shown: bool = False,
) -> None:
    """Print the per-host summary (or the JSON), each failed host's error, and end with the
    worst host's exit code. `judged`: a `failed` host is a verdict the tables already show
    (diff's drift), not an error to repeat on stderr (as a single-host diff prints none).
    `stands_shown`: an interrupted host's Deployed/Not deployed lines were printed already."""
    code = fleet.worst_exit(outcomes)
    data = {
        "command": command,
        "exit_code": code,
        **(extra or {}),
        "hosts": [outcome_json(o, result_json) for o in outcomes],
    }
    if not as_json:
        print_table(
            f"{command} on {len(outcomes)} hosts",
            [
                Column("host"),
                Column("result", STATUS),
                Column("exit"),
                Column("time", drop_order=1),
                Column("detail", WORDS),
            ],
            [
                (
                    o.host,
                    o.status,
                    str(o.exit_code) if o.status != OutcomeStatus.SKIPPED else "-",
                    f"{o.elapsed:.1f}s" if o.elapsed else "-",
                    _first_line(o.message) if o.error is not None else describe(o),
                )
                for o in outcomes
            ],
        )
    for o in outcomes:
        if judged and o.status == OutcomeStatus.FAILED:
            continue
        if o.error is not None and o.status not in (OutcomeStatus.OK, OutcomeStatus.SKIPPED):
            if getattr(o.error, "logs", None):  # an unhealthy service: its logs first
                print_service_logs(o.error, o.host)
            message = o.error.message
            if stands_shown and o.status == OutcomeStatus.INTERRUPTED:
                message = _first_line(message)
            print_error(f"{o.host}: {message}", o.error.hint)
    if code == ExitCode.OK or (judged and code == ExitCode.FAILURE):
        if as_json:
            print_json(data)
        if code:
            raise typer.Exit(code)  # drift is a result, as for a single-host diff
        return
    raise fleet_ops.GroupError(
        fleet_ops.describe_failures(outcomes),
        code,
        hint="each host's error is shown above",
        report=data if as_json else None,
    )


@contextlib.contextmanager
def running(hosts: Sequence[HostConfig]) -> Iterator[HostsView]:
    with HostsView(hosts) as view:
        yield view


def run_each(hosts: Sequence[HostConfig], one, parallel: int) -> list[HostOutcome]:
    """`one(host, transport, progress)` on every host, at most `parallel` at a time, each
    host's progress in the live view."""
    with running(hosts) as view:
        return fleet.run_on_hosts(hosts, one, parallel=parallel, on_event=view)


def succeeded(outcomes: list[HostOutcome], as_json: bool) -> list[HostOutcome]:
    """The outcomes whose results are drawn as tables: the hosts that succeeded (none with
    --json, where `finish` prints every result)."""
    return [] if as_json else [o for o in outcomes if o.ok]


# --- the commands -------------------------------------------------------------------------


def pull(
    config: Config,
    hosts: list[HostConfig],
    paths: list[str] | None,
    force: bool,
    reference_name: str | None,
    parallel: int,
    as_json: bool,
) -> None:
    from kerneldev.config import remember_config

    reference = reference_host(hosts, reference_name)
    ordered = [reference] + [h for h in hosts if h.name != reference.name]
    with running(ordered) as view:
        outcomes = fleet_ops.pull_group(
            ordered, reference, paths, force=force, parallel=parallel, on_event=view
        )
    if not any(o.status == OutcomeStatus.INTERRUPTED for o in outcomes):
        # A signal once every host had ended (a pull's record is shielded): nothing was cut
        # short, so the pull stands (as a one-host pull and a group push say).
        note_late_ctrl_c("every host's pull had ended")
    if outcomes[0].ok:
        try:
            remember_config(reference.workspace, config.path, reference.name)
        except OSError as err:
            print_warning(f"could not note the config in the workspace: {err}")
    comparisons = {o.host: o.result for o in outcomes[1:] if o.result is not None}
    pulled = outcomes[0].result if outcomes[0].ok else None
    if pulled is not None and not as_json:
        paths_seen = sorted(
            {f.path for f in pulled.files} | set(pulled.missing)
            | {p for c in comparisons.values() for p in c.files}
        )  # fmt: skip
        rows = []
        for path in paths_seen:
            row = [path, "pulled" if path in {f.path for f in pulled.files} else "missing"]
            for h in ordered[1:]:
                c = comparisons.get(h.name)
                row.append(c.files.get(path, fleet_ops.LiveMatch.SAME) if c else None)
            rows.append(row)
        print_table(
            f"pull from {reference.name} into {pulled.workspace}; other hosts compared with it",
            [Column("path", PATH), Column(reference.name, STATUS)]
            + [Column(h.name, STATUS) for h in ordered[1:]],
            rows,
        )
        print_info(
            f"{pulled.transferred} transferred, "
            f"{len(pulled.files) - pulled.transferred} already identical"
        )

    def describe(o: HostOutcome) -> str:
        if o.host == reference.name:
            return f"reference: {len(o.result.files)} file(s), {o.result.transferred} transferred"
        c = o.result
        return f"same as {reference.name}" + (
            f"; base recorded for {len(c.bases_recorded)} file(s)" if c.bases_recorded else ""
        )

    finish("pull", outcomes, as_json, describe, extra={"reference": reference.name})


def diff(
    hosts: list[HostConfig], paths: list[str] | None, patch: bool, parallel: int, as_json: bool
) -> None:
    from kerneldev.cli.host_steps import print_patch

    with running(hosts) as view:
        outcomes, table = fleet_ops.diff_group(
            hosts, paths, patch=patch, parallel=parallel, on_event=view
        )
    for o in outcomes:
        if o.result is not None:
            for warning in o.result.warnings:
                print_warning(f"{o.host}: {warning}")
    if not as_json:
        names = table.hosts
        rows = []
        for path in sorted(table.live):
            odd = table.odd.get(path, [])
            across = "same" if not odd else "differs: " + ", ".join(odd)
            rows.append([path, *(table.status[path].get(h) for h in names), across])
        print_table(
            "live vs workspace per host; live across hosts",
            [Column("path", PATH), *(Column(h, STATUS) for h in names), Column("across hosts")],
            rows,
        )
        if patch:
            for o in outcomes:
                files = o.result.files if o.result is not None else []
                texts = [t for f in files for t in (f.patch, f.mirror_patch) if t]
                if texts:
                    host_heading(o.host)
                for text in texts:
                    print_patch(text)

    def describe(o: HostOutcome) -> str:
        return f"{len(o.result.files)} file(s) in sync"

    finish(
        "diff",
        outcomes,
        as_json,
        describe,
        result_json=lambda report: report.as_json(),
        extra={"across_hosts": table.as_json()["files"]},
        judged=True,
    )


def _describe_push(o: HostOutcome) -> str:
    r = o.result
    if r is None:
        return ""
    if r.dry_run:
        return f"would upload {len(r.uploads)} file(s)" + (
            f", refuse {len(r.refused)}" if r.refused else ""
        )
    if not r.deploy_id:
        return "nothing to push"
    text = f"deployed {len(r.deployed)} file(s) as {r.deploy_id}"
    if r.health is not None and r.health.healthy:
        text += f"; healthy after {r.health.elapsed:.1f}s"
    return text


def push(
    hosts: list[HostConfig],
    req: fleet_ops.PushRequest,
    parallel: int,
    serial: int | None,
    as_json: bool,
) -> None:
    from kerneldev.service.restart import require_service

    if req.restart and not req.dry_run:
        for host in hosts:  # fail before deploying anywhere, not after the first wave
            require_service(host.service, host.name)
    with running(hosts) as view:
        outcomes = fleet_ops.push_group(
            hosts, req, parallel=parallel, serial=serial, on_event=view, on_wave=view.on_wave
        )
    interrupted = any(o.status == OutcomeStatus.INTERRUPTED for o in outcomes)
    if interrupted:
        print_info(_interrupt_summary(outcomes))
    elif not req.dry_run:
        # A signal once every host had ended (its record and unlock are shielded): nothing
        # was cut short, so each host's outcome stands as it is.
        note_late_ctrl_c("every host's push had ended")
    failed_dry_run = req.dry_run and any(o.ok and o.result.refused for o in outcomes)
    if failed_dry_run:
        for o in outcomes:
            if o.ok and o.result.refused:
                o.status, o.exit_code = OutcomeStatus.FAILED, int(ExitCode.FAILURE)
                names = printable_list(f.path for f in o.result.refused)
                o.error = KerneldevError(f"would refuse {names}")
    finish("push", outcomes, as_json, _describe_push, stands_shown=interrupted)


def _interrupt_summary(outcomes: list[HostOutcome]) -> str:
    """After Ctrl-C: what each host ended with (its own Deployed/Not deployed lines)."""
    lines = ["interrupted; where each host stands:"]
    for o in outcomes:
        if o.status == OutcomeStatus.INTERRUPTED:
            lines.append(f"  {o.host}: " + (o.message or "").replace("\n", "; "))
        elif o.ok:
            lines.append(f"  {o.host}: finished: {_describe_push(o)}")
        else:
            lines.append(f"  {o.host}: {o.status}: {_first_line(o.message)}")
    return "\n".join(lines)


def restart(
    hosts: list[HostConfig],
    break_lock: bool,
    lock_wait: float,
    parallel: int,
    serial: int | None,
    as_json: bool,
) -> None:
    from kerneldev.service.restart import require_service

    for host in hosts:
        require_service(host.service, host.name)

    def one(host, transport, progress):
        return fleet_ops.restart_host(transport, host, progress, break_lock, lock_wait)

    with running(hosts) as view:
        if serial:
            outcomes = fleet.run_in_waves(
                hosts, one, serial=serial, parallel=parallel, on_event=view, on_wave=view.on_wave
            )
        else:
            outcomes = fleet.run_on_hosts(hosts, one, parallel=parallel, on_event=view)

    def describe(o: HostOutcome) -> str:
        h = o.result
        return f"healthy after {h.elapsed:.1f}s ({h.last_check})" if h.health else "restarted"

    finish("restart", outcomes, as_json, describe)


def rollback(
    hosts: list[HostConfig], req: fleet_ops.RollbackRequest, parallel: int, as_json: bool
) -> None:
    def one(host, transport, progress):
        return fleet_ops.rollback_host(transport, host, req, progress)

    outcomes = run_each(hosts, one, parallel)

    def describe(o: HostOutcome) -> str:
        r = o.result
        if r.dry_run:
            return f"would restore {len(r.plan)} file(s) of {r.rolls_back}"
        if not r.deploy_id:
            return "nothing to restore"
        return f"rolled back {r.rolls_back} as {r.deploy_id} ({len(r.files)} file(s))"

    finish("rollback", outcomes, as_json, describe)


def bench(
    hosts: list[HostConfig],
    run_harness: Callable[..., Any],  # bench's: (transport, host) -> BenchResult
    *,
    parallel: int,
    as_json: bool,
    render: Callable[[Any, Any], None],  # bench.render: passed in, bench imports this module
) -> None:
    from kerneldev.bench import kernel_bench as bench_core

    def one(host, transport, progress):
        progress("running the harness")
        result = run_harness(transport, host)
        if result.save_error is not None:  # the run is in the report (--json), not lost
            err = result.save_error
            raise BenchError(err.message, err.hint, report=bench_core.bench_report(result))
        if not result.ok:
            bad = [
                f"{r['shape']} {r['label']}" for r in result.data["results"] if r["status"] != "ok"
            ]
            raise KerneldevError(
                "failed accuracy or did not run: " + "; ".join(bad),
                report=bench_core.bench_report(result),
            )
        return result

    outcomes = run_each(hosts, one, parallel)
    for o in succeeded(outcomes, as_json):
        host_heading(o.host)
        render(o.result, None)
        print_info(f"{o.host}: saved: {o.result.saved_to}")

    def describe(o: HostOutcome) -> str:
        return f"all variants passed accuracy; saved {o.result.saved_to}"

    def result_json(value):
        if isinstance(value, bench_core.BenchResult):
            return bench_core.bench_report(value)
        return value

    finish("bench", outcomes, as_json, describe, result_json=result_json)


def service_bench(
    config: Config,
    hosts: list[HostConfig],
    request,
    parallel: int,
    as_json: bool,
    allow_same_kernel: bool = False,
) -> None:
    from kerneldev.bench import service_bench as sb
    from kerneldev.cli.commands import service_bench as service_bench_cmd
    from kerneldev.service.variants import check_variants

    for host in hosts:
        check_variants(host, request.variants)  # exit 2 before connecting

    def one(host, transport, progress):
        result = sb.run_service_bench(
            transport,
            host,
            request,
            on_progress=progress,
            results_dir=config.path.parent / sb.RESULTS_DIR,
            allow_same_kernel=allow_same_kernel,
        )
        report = service_bench_cmd.service_report(result)
        if result.save_error is not None:  # the run is in the report (--json), not lost
            err = result.save_error
            raise BenchError(err.message, err.hint, report=report)
        if not result.ok:
            raise KerneldevError("some requests failed (see `failed` in the result)", report=report)
        return result

    outcomes = run_each(hosts, one, parallel)
    for o in succeeded(outcomes, as_json):
        host_heading(o.host)
        service_bench_cmd.render(o.result.data)
        print_info(f"{o.host}: saved: {o.result.saved_to}")

    def result_json(value):
        if isinstance(value, sb.ServiceBenchResult):
            return service_bench_cmd.service_report(value)
        return value

    finish(
        "bench --service",
        outcomes,
        as_json,
        lambda o: f"saved {o.result.saved_to}",
        result_json=result_json,
    )
