"""`kerneldev watch`: parse, run `kerneldev.watch.Watcher`, print one line per event."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from kerneldev import interrupt
from kerneldev.cli import environment
from kerneldev.cli.common import (
    HOST_OPTION,
    JSON_OPTION,
    NO_IMPORT_CHECK_OPTION,
    SHAPES_HELP,
    config_path,
    flag,
    variants_option,
)
from kerneldev.cli.output import print_error, print_line, to_jsonable
from kerneldev.config import load_config
from kerneldev.errors import ExitCode, KerneldevError
from kerneldev.loop import lock as host_lock
from kerneldev.printable import printable, printable_list

if TYPE_CHECKING:
    from kerneldev import watch

# `kerneldev.watch` (and what it imports) loads only when the command runs: `--help` stays fast.
DEFAULT_DEBOUNCE_MS = 300  # = watch.DEFAULT_DEBOUNCE

WATCH_PATHS_ARGUMENT = typer.Argument(
    None,
    metavar="PATHS",
    help="Files to watch: workspace paths or paths relative to the host's root "
    "(default: every configured file).",
    show_default=False,
)


def watch_command(
    ctx: typer.Context,
    paths: list[str] | None = WATCH_PATHS_ARGUMENT,
    restart: bool = flag(
        "--restart", help="Restart the service after each push and wait for health."
    ),
    no_rollback: bool = flag(
        "--no-rollback",
        help="With --restart: leave a deploy whose service never becomes healthy in place "
        "(default: roll it back and restart again).",
    ),
    bench_spec: str = typer.Option(
        None,
        "--bench",
        metavar="QUICK-SPEC",
        help="After each push, check and time the kernel variants on the host on these shapes "
        "(as `bench --shapes`): " + SHAPES_HELP + ".",
        show_default=False,
    ),
    variants: str = variants_option(
        "With --bench: the variants to check (simt, mma, dispatch, flashinfer; as "
        "`bench --variants`)."
    ),
    cpu: bool = flag(
        "--cpu",
        help="With --bench: run under the Triton interpreter on the host's CPU (tiny shapes; "
        "times are meaningless).",
    ),
    debounce: int = typer.Option(
        DEFAULT_DEBOUNCE_MS,
        "--debounce",
        metavar="MS",
        min=0,
        help="Milliseconds without another change that end a save (one push per burst).",
    ),
    no_import_check: bool = NO_IMPORT_CHECK_OPTION,
    lock_wait: float = typer.Option(
        host_lock.DEFAULT_WAIT,
        "--lock-wait",
        metavar="SECONDS",
        min=0,
        help="How long each push waits for another command's lock on the host.",
    ),
    host_name: str | None = HOST_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Push each save of the workspace's files to the host (as `push` does), optionally
    restart and check the kernel; one line per event. Ctrl-C stops (exit 0 between events)."""
    from kerneldev import watch
    from kerneldev.bench import kernel_bench as bench

    config = load_config(config_path(ctx))
    host = config.host(host_name)  # one host: a group name is refused here
    options = watch.WatchOptions(
        paths=list(paths) if paths else None,
        restart=restart,
        rollback_on_unhealthy=not no_rollback,
        import_check=not no_import_check,
        bench_shapes=bench_spec,
        bench_variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
        bench_cpu=cpu,
        results_dir=config.path.parent / bench.RESULTS_DIR,
        debounce=debounce / 1000,
        lock_wait=lock_wait,
    )
    status = _Status(enabled=not as_json)
    emit = _json_line if as_json else _human_line

    def on_event(event: watch.WatchEvent) -> None:
        status.stop()
        emit(event)

    try:
        watcher = watch.Watcher(host, options, on_event, on_progress=status.show)
        watcher.run()
    except KerneldevError as err:
        status.stop()
        if not as_json:
            raise
        # JSON lines stay JSON lines: the error is one more object, then the exit code.
        _json_line({"kind": "error", "host": host.name, "error": _error(err)})
        if isinstance(err, interrupt.Interrupted):
            interrupt.consume()  # reported here, not again when the command returns
        if err.exit_code != ExitCode.INTERRUPTED:  # for 130 kerneldev's main says "interrupted"
            print_error(err.message, err.hint)
        raise typer.Exit(int(err.exit_code)) from None
    finally:
        status.stop()


def _error(err: KerneldevError) -> dict:
    return {
        "code": int(err.exit_code),
        "type": type(err).__name__,
        "message": err.message,
        "hint": err.hint,
    }


class _Status:
    """What is happening now (pushing, restarting, reconnecting) as a transient spinner on a
    terminal's stderr; the event's line replaces it. Nothing in a pipe."""

    def __init__(self, enabled: bool) -> None:
        env = environment.current()
        self.enabled = enabled and env.stderr_isatty
        self.status = None

    def show(self, text: str) -> None:
        if not self.enabled:
            return
        from rich.text import Text

        if self.status is None:
            self.status = environment.current().err_console.status(Text(text))
            self.status.start()
        else:
            self.status.update(Text(text))

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


def _json_line(event) -> None:
    env = environment.current()
    env.stdout.write(json.dumps(to_jsonable(event), separators=(",", ":")) + "\n")
    env.stdout.flush()


def _human_line(event: watch.WatchEvent) -> None:
    print_line(describe(event))


def _clock(event: watch.WatchEvent) -> str:
    # now_iso: 2026-11-30T06:30:12Z -> 06:30:12
    return event.time[11:19] if len(event.time) >= 19 else event.time


def _files(paths: list[str]) -> str:
    shown = printable_list(paths[:4])
    return shown + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")


def describe(event: watch.WatchEvent) -> str:
    """The one status line of an event."""
    from kerneldev import watch

    at = _clock(event)
    if event.kind == watch.READY:
        line = (
            f"{at} watching {len(event.watching)} file(s) of {event.host} in {event.workspace} "
            f"(live: {event.root}); Ctrl-C stops"
        )
        return line + "".join(f"\n{at} note: {n}" for n in event.notes)
    if event.kind == watch.DISCONNECTED:
        waiting = f"; {len(event.waiting)} saved file(s) wait" if event.waiting else ""
        return (
            f"{at} connection to {event.host} lost ({event.message}); reconnect attempt "
            f"{event.attempt} in {event.retry_in:.1f}s{waiting}"
        )
    if event.kind == watch.RECONNECTED:
        waiting = f"; pushing {_files(event.waiting)}" if event.waiting else ""
        return f"{at} reconnected to {event.host} after {event.seconds:.1f}s{waiting}"
    if event.kind == watch.STOPPED:
        why = f" ({event.signal})" if event.signal else ""
        left = f"; not pushed: {_files(event.waiting)}" if event.waiting else ""
        return f"{at} stopped watching {event.host}{why} after {event.seq} push(es){left}"
    return f"{at} #{event.seq} " + " | ".join(_push_parts(event))


def _push_parts(event: watch.WatchEvent) -> list[str]:
    from kerneldev import watch

    took = f" in {event.seconds:.2f}s" if event.seconds is not None else ""
    parts = []
    if event.deployed:
        parts.append(f"pushed {_files(event.deployed)} as {event.deploy_id}{took}")
    elif event.outcome == watch.UNCHANGED and event.message:  # e.g. the files were deleted
        parts.append(f"{_files(event.changed)}: {event.message}")
    elif event.outcome == watch.UNCHANGED:
        parts.append(f"{_files(event.changed)}: live already has these bytes, nothing pushed")
    elif event.outcome == watch.FAILED and not event.deploy_id:
        parts.append(f"push of {_files(event.changed)} FAILED: {event.message}")
    if event.refused:
        refused = ", ".join(f"{printable(f.path)} ({f.status})" for f in event.refused)
        parts.append(
            f"REFUSED {refused}: changed on the host since the last pull/push, not "
            "overwritten; see `kerneldev diff --patch`"
        )
    if event.health is not None:
        h = event.health
        if h.healthy:
            parts.append(f"healthy in {h.elapsed:.1f}s ({h.last_check})")
        else:
            parts.append(f"UNHEALTHY after {h.elapsed:.1f}s ({h.last_check})")
    if event.outcome == watch.ROLLED_BACK:
        parts.append(f"rolled back as {event.rollback_id}: {event.message}")
    elif event.outcome in (watch.UNHEALTHY,) or (event.outcome == watch.FAILED and event.deploy_id):
        parts.append(f"FAILED: {event.message}")
    if event.check is not None:
        parts.append(_check_part(event.check))
    parts += [f"note: {note}" for note in event.notes]  # a stale lock taken over, leftovers
    return parts


def _check_part(check: watch.CheckSummary) -> str:
    if check.verdict == "error":
        return f"check ERROR: {check.message}"
    times = ", ".join(
        f"{label} {'-' if us is None else f'{us:.1f}µs'}" for label, us in check.median_us.items()
    )
    ratios = ", ".join(f"{label} {s:.2f}x" for label, s in check.speedup.items() if s)
    text = "check ok" if check.ok else f"check FAILED ({'; '.join(check.failed)})"
    took = f" in {check.seconds:.1f}s" if check.seconds is not None else ""
    text += f"{took}: {times}" + (f" ({ratios})" if ratios else "")
    if check.cpu:
        text += " [interpreter: times meaningless]"
    return text


def register(app: typer.Typer) -> None:
    app.command("watch", short_help="Push each save; optionally restart and bench. Ctrl-C stops.")(
        watch_command
    )
