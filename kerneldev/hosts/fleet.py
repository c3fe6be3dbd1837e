"""Run one operation on several hosts at once: a thread pool over the existing transports.

`run_on_hosts(hosts, fn, parallel=N, on_event=...)` calls `fn(host, transport, progress)` for
every host, at most N at a time, each in a worker thread with its own transport (one connection
per host, opened lazily by the transport on first use and closed when `fn` returns). Every host
ends with a `HostOutcome`: what `fn` returned, or the error it raised (a `KerneldevError` keeps
its message, hint, exit code and partial report), so a failure on one host is reported for that
host and never hides the others. `run_in_waves` runs hosts in consecutive waves and stops after
the first wave with a host that failed; the hosts of the later waves are `skipped`.

Events (`HostEvent`: started, progress text, done) reach `on_event` in the *calling* thread, in
order per host, so a renderer needs no locking and sees the command's output environment.

Ctrl-C: the CLI turns SIGINT into a flag (`interrupt.py`) that every worker sees at its next
safe point (between upload chunks, between files, in health waits), so each host stops there,
saves its records and raises `Interrupted`; hosts that had not started yet are not started
(outcome `interrupted`, message "not started"). A second Ctrl-C does not abandon hosts midway:
the runner keeps waiting for each to reach its safe point.

The exit code of a group is that of its worst host, in this order (worst first):
interrupted (130) / terminated (143) > usage (2) > unreachable (3) > failure (1) > ok (0).
Usage outranks unreachable because it is the same on every host (a bad option or config) and
must not hide behind a network problem; a skipped host adds nothing (the wave that stopped the
run already failed).
"""

from __future__ import annotations

import contextvars
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import ExitCode, KerneldevError
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.base import Transport
from kerneldev.status_words import StatusWord

DEFAULT_PARALLEL = 8


class OutcomeStatus(StatusWord):
    """How one host's part of a group command ended."""

    OK = "ok"
    FAILED = "failed"  # the operation ran and found a problem (exit 1)
    USAGE = "usage"  # bad usage or config for this host (exit 2)
    UNREACHABLE = "unreachable"  # connection or host key (exit 3)
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM (exit 130 / 143), or not started because of it
    SKIPPED = "skipped"  # not started: an earlier wave failed


# Worst first: the group's exit code is that of its first-ranked host.
EXIT_ORDER: tuple[int, ...] = (
    int(ExitCode.INTERRUPTED),
    int(ExitCode.TERMINATED),
    int(ExitCode.USAGE),
    int(ExitCode.UNREACHABLE),
    int(ExitCode.FAILURE),
    int(ExitCode.OK),
)


class Progress(Protocol):
    """`progress(text)`: the host's latest step for the live view; `warning=True`: something
    the user must read afterwards too (a stale lock taken over), printed as a warning."""

    def __call__(self, text: str, *, warning: bool = False) -> None: ...


HostFunction = Callable[[HostConfig, Transport, Progress], Any]
OpenTransport = Callable[[HostConfig], Transport]


@dataclass
class HostOutcome:
    """How one host ended. `result` is what the operation returned (or the partial report of
    its error: a refused plan, an unhealthy health result); `error` is None on success."""

    host: str
    status: str  # OK, FAILED, USAGE, UNREACHABLE, INTERRUPTED, SKIPPED
    exit_code: int
    result: Any = None
    error: KerneldevError | None = None
    elapsed: float = 0.0  # seconds, 0 for a host that did not start

    @property
    def ok(self) -> bool:
        return self.status == OutcomeStatus.OK

    @property
    def message(self) -> str | None:
        return self.error.message if self.error is not None else None

    @property
    def hint(self) -> str | None:
        return self.error.hint if self.error is not None else None


@dataclass
class HostEvent:
    """What a renderer sees: `kind` is "started", "progress" or "warning" (with `text`) or
    "done" (with `outcome`)."""

    host: str
    kind: str
    text: str | None = None
    outcome: HostOutcome | None = None


def status_of(code: int) -> str:
    """The outcome status for an exit code."""
    return {
        int(ExitCode.OK): OutcomeStatus.OK,
        int(ExitCode.USAGE): OutcomeStatus.USAGE,
        int(ExitCode.UNREACHABLE): OutcomeStatus.UNREACHABLE,
        int(ExitCode.INTERRUPTED): OutcomeStatus.INTERRUPTED,
        int(ExitCode.TERMINATED): OutcomeStatus.INTERRUPTED,
    }.get(int(code), OutcomeStatus.FAILED)


def worst_exit(outcomes: Sequence[HostOutcome]) -> int:
    """The group's exit code: the worst of its hosts' (see the module docstring)."""
    codes = {o.exit_code for o in outcomes if o.status != OutcomeStatus.SKIPPED}
    for code in EXIT_ORDER:
        if code in codes:
            return code
    return max(codes, default=int(ExitCode.OK))  # a code outside the order: still not 0


def failed_outcome(host: str, error: KerneldevError, elapsed: float = 0.0) -> HostOutcome:
    """The outcome of a host whose operation raised `error` (its report kept as the result)."""
    code = int(error.exit_code)
    return HostOutcome(host, status_of(code), code, error.report, error, elapsed)


def skipped_outcome(host: str, why: str) -> HostOutcome:
    return HostOutcome(host, OutcomeStatus.SKIPPED, int(ExitCode.OK), None, KerneldevError(why))


def _not_started_by_signal(host: str) -> HostOutcome:
    signum = interrupt.pending() or 2
    err = interrupt.Interrupted(signum, "not started: interrupted before this host began")
    return failed_outcome(host, err)


def run_on_hosts(
    hosts: Sequence[HostConfig],
    fn: HostFunction,
    *,
    parallel: int = DEFAULT_PARALLEL,
    on_event: Callable[[HostEvent], None] | None = None,
    connect: OpenTransport = open_transport,
) -> list[HostOutcome]:
    """Run `fn(host, transport, progress)` on every host, at most `parallel` at a time; one
    outcome per host, in the order of `hosts`. `progress(text)` sends a progress event.
    Errors other than `KerneldevError` (bugs) are re-raised after every host has ended."""
    if not hosts:
        return []
    events: queue.Queue[HostEvent] = queue.Queue()
    outcomes: dict[str, HostOutcome] = {}
    bugs: list[BaseException] = []

    def work(host: HostConfig) -> None:
        if interrupt.requested():
            outcome = _not_started_by_signal(host.name)
            events.put(HostEvent(host.name, "done", outcome=outcome))
            return
        events.put(HostEvent(host.name, "started"))
        start = time.monotonic()

        def progress(text: str, *, warning: bool = False) -> None:
            events.put(HostEvent(host.name, "warning" if warning else "progress", text=text))

        try:
            with connect(host) as transport:
                result = fn(host, transport, progress)
            outcome = HostOutcome(host.name, OutcomeStatus.OK, int(ExitCode.OK), result, None)
        except KerneldevError as err:
            outcome = failed_outcome(host.name, err)
        except BaseException as err:  # a bug: reported for the host, raised at the end
            bugs.append(err)
            outcome = failed_outcome(host.name, KerneldevError(f"internal error: {err!r}"))
        outcome.elapsed = time.monotonic() - start
        events.put(HostEvent(host.name, "done", outcome=outcome))

    workers = max(1, min(int(parallel), len(hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kerneldev-host") as pool:
        # Each task runs in a copy of the caller's context (the CLI's output environment).
        futures: list[Future] = [
            pool.submit(contextvars.copy_context().run, work, host) for host in hosts
        ]
        _pump(events, futures, outcomes, on_event)
    if bugs:
        raise bugs[0]
    return [outcomes[h.name] for h in hosts]


def _pump(
    events: queue.Queue[HostEvent],
    futures: list[Future],
    outcomes: dict[str, HostOutcome],
    on_event: Callable[[HostEvent], None] | None,
) -> None:
    """Hand events to `on_event` in this thread until every host is done. A second Ctrl-C
    (raised here by the signal handler) does not stop the wait: each worker stops at its next
    safe point and must still save its records."""
    while True:
        try:
            event = events.get(timeout=0.1)
        except queue.Empty:
            if all(f.done() for f in futures) and events.empty():
                return
            continue
        except interrupt.Interrupted:
            continue
        if event.kind == "done" and event.outcome is not None:
            outcomes[event.host] = event.outcome
        if on_event is not None:
            try:
                with interrupt.shield():
                    on_event(event)
            except interrupt.Interrupted:
                pass


def run_in_waves(
    hosts: Sequence[HostConfig],
    fn: HostFunction,
    *,
    serial: int,
    parallel: int = DEFAULT_PARALLEL,
    on_event: Callable[[HostEvent], None] | None = None,
    connect: OpenTransport = open_transport,
    on_wave: Callable[[int, list[HostConfig]], None] | None = None,
) -> list[HostOutcome]:
    """`run_on_hosts` over consecutive waves of `serial` hosts (in order); after a wave with a
    host that did not end ok, the hosts of the later waves are not started (`skipped`), and
    after Ctrl-C they are `interrupted` (not started)."""
    size = max(1, int(serial))
    waves = [list(hosts[i : i + size]) for i in range(0, len(hosts), size)]
    outcomes: list[HostOutcome] = []
    stopped_by: str | None = None
    for number, wave in enumerate(waves, 1):
        if interrupt.requested() or any(o.status == OutcomeStatus.INTERRUPTED for o in outcomes):
            outcomes += [_not_started_by_signal(h.name) for h in wave]
            continue
        if stopped_by is not None:
            outcomes += [skipped_outcome(h.name, stopped_by) for h in wave]
            continue
        if on_wave is not None:
            on_wave(number, wave)
        done = run_on_hosts(
            wave, fn, parallel=min(parallel, len(wave)), on_event=on_event, connect=connect
        )
        outcomes += done
        bad = [o.host for o in done if not o.ok]
        if bad:
            stopped_by = f"not started: wave {number} failed on {', '.join(bad)}"
    return outcomes
