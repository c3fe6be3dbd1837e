"""`kerneldev status`: where each host stands, read-only.

Per host: whether it can be reached (and why not), its last deploy from the host's shared
history (`<root>/.kerneldev/history.jsonl`, everyone's deploys), whether the live files still
hold the bytes the history says were deployed (hashed on the host in one command), the
service's health when `service.health` is configured, and the GPUs nvidia-smi reports.

"What should be live" is taken from the whole history, later deploys winning per file: a
file an earlier deploy wrote and nobody redeployed is checked too, so an edit on the host is
flagged whichever deploy it overwrote.

The exit status of a host (worst wins across hosts): 0 reachable and every deployed file
matches (and healthy, when a health check is configured); 1 reachable with a problem (a file
changed since its deploy, an unhealthy service, a step that failed); 3 unreachable (connection,
authentication or host key).

For an SSH host it also says whether a kept session runs (pid, connection age, idle time,
socket), as `kerneldev session list` does.

Several hosts are looked at in parallel by `kerneldev.hosts.fleet` (a thread pool, one connection
each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kerneldev import interrupt
from kerneldev.config import HostConfig
from kerneldev.errors import ExitCode, HostConnectionError, HostKeyError, KerneldevError
from kerneldev.hosts import fleet
from kerneldev.hosts import gpus as gpus_core
from kerneldev.hosts.transport import open_transport
from kerneldev.hosts.transport.base import Transport
from kerneldev.hosts.transport.session.control import SessionStatus
from kerneldev.hosts.transport.session.control import status as session_status
from kerneldev.loop import history
from kerneldev.loop.workspace import glob_escape
from kerneldev.service.restart import check_health

HEALTH_TIMEOUT = 10.0  # seconds for one health check


@dataclass(frozen=True)
class Problem:
    """Why a host could not be reached, or a step that failed on a reachable host."""

    type: str  # the error's class name, e.g. HostConnectionError
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class LastDeploy:
    id: str
    time: str
    user: str
    kind: str  # push or rollback
    outcome: str  # deployed, partial, interrupted, auto-rollback
    rolls_back: str | None
    files: list[str]


@dataclass(frozen=True)
class LiveFile:
    """A file the history deployed: the bytes it says are live, and what is live."""

    path: str
    deploy_id: str  # the last deploy that wrote (or removed) it
    deployed_sha256: str | None  # None: that deploy removed the file
    live_sha256: str | None  # None: not on the host

    @property
    def matches(self) -> bool:
        return self.deployed_sha256 == self.live_sha256


@dataclass(frozen=True)
class ServiceStatus:
    health: str  # the URL or command checked
    healthy: bool
    last_check: str  # "HTTP 200", "exit 1", "no answer"


@dataclass
class HostStatus:
    host: str
    reachable: bool
    unreachable: Problem | None = None  # why not
    last_deploy: LastDeploy | None = None
    deploys: int = 0  # records in the host's history
    live: list[LiveFile] = field(default_factory=list)
    service: ServiceStatus | None = None  # None: no `service.health` configured
    gpus: gpus_core.GpuReport | None = None
    problems: list[Problem] = field(default_factory=list)  # steps that failed on the host
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C / SIGTERM: what is here was collected before it
    session: SessionStatus | None = None  # the host's kept session (None: not an SSH host)

    @property
    def changed(self) -> list[str]:
        """Files whose live bytes differ from what their last deploy put there."""
        return [f.path for f in self.live if not f.matches]

    @property
    def live_matches(self) -> bool | None:
        """None when nothing was ever deployed (there is nothing to match)."""
        return None if not self.live else not self.changed

    @property
    def exit_code(self) -> ExitCode:
        if not self.reachable:
            return ExitCode.UNREACHABLE
        if self.problems or self.changed or (self.service and not self.service.healthy):
            return ExitCode.FAILURE
        return ExitCode.OK

    def as_json(self) -> dict:
        from dataclasses import asdict

        data = asdict(self)
        data["live_matches"] = self.live_matches
        data["changed"] = self.changed
        data["exit_code"] = int(self.exit_code)
        for entry, live in zip(data["live"], self.live, strict=True):
            entry["matches"] = live.matches
        return data


def worst_exit(codes: list[ExitCode]) -> ExitCode:
    """The exit code of several hosts: the worst one, ranked as for every group command
    (`fleet.EXIT_ORDER`: unreachable 3 > problem 1 > ok 0)."""
    for code in fleet.EXIT_ORDER:
        if code in codes:
            return ExitCode(code)
    return ExitCode.OK


def host_status(transport: Transport, host: HostConfig) -> HostStatus:
    """Look at one host over `transport` (connected on first use). Never raises for the host's
    own problems: an unreachable host comes back with `reachable=False` and why."""
    status = HostStatus(host=host.name, reachable=True)
    steps: list[Callable[[], None]] = [
        lambda: _deploys(transport, host, status),
        lambda: _service(transport, host, status),
        lambda: _gpus(transport, status),
    ]
    for step in steps:
        try:
            interrupt.check()  # Ctrl-C between steps: the next one is not started
            step()
        except interrupt.Interrupted as err:
            status.interrupted = True
            err.report = status  # what was collected before the signal
            raise
        except (HostConnectionError, HostKeyError) as err:  # incl. a dropped connection
            status.reachable = False
            status.unreachable = _problem(err)
            return status
        except KerneldevError as err:
            status.problems.append(_problem(err))
    if host.transport == "ssh":
        status.session = session_status(host)
    return status


def collect_status(
    hosts: list[HostConfig],
    *,
    connect_timeout: float | None = None,
    parallel: int = fleet.DEFAULT_PARALLEL,
) -> list[HostStatus]:
    """`host_status` of every host, in the given order, at most `parallel` at a time.
    Ctrl-C / SIGTERM raises `Interrupted` whose `report` is every host's status as far as it
    got (`interrupted` set on the hosts it cut short or kept from starting)."""
    outcomes = fleet.run_on_hosts(
        hosts,
        lambda host, transport, _progress: host_status(transport, host),
        parallel=parallel,
        connect=lambda host: open_transport(host, connect_timeout=connect_timeout),
    )
    statuses = [_from_outcome(h, o) for h, o in zip(hosts, outcomes, strict=True)]
    stopped = [o.error for o in outcomes if isinstance(o.error, interrupt.Interrupted)]
    if stopped:
        err = interrupt.Interrupted(stopped[0].signum)  # the run's, not "not started"
        err.report = statuses
        raise err
    return statuses


def _from_outcome(host: HostConfig, outcome: fleet.HostOutcome) -> HostStatus:
    if outcome.error is None:
        return outcome.result
    if isinstance(outcome.error, (HostConnectionError, HostKeyError)):  # opening the transport
        return HostStatus(host=host.name, reachable=False, unreachable=_problem(outcome.error))
    if isinstance(outcome.error, interrupt.Interrupted):
        if isinstance(outcome.error.report, HostStatus):
            return outcome.error.report
        # Not started, or stopped while connecting: nothing is known about it.
        return HostStatus(
            host=host.name, reachable=False, interrupted=True, notes=[outcome.error.message]
        )
    raise outcome.error  # `host_status` itself lets nothing else out


# --- the steps --------------------------------------------------------------------------


def _deploys(transport: Transport, host: HostConfig, status: HostStatus) -> None:
    path = history.history_path(host.root)
    if not transport.exists(path):
        if not transport.exists(host.root):  # asked only here: a history implies a root
            status.problems.append(
                Problem(
                    "MissingRoot",
                    f"root {host.root} does not exist on {host.name}",
                    "fix `root` in hosts.yaml; `kerneldev doctor` checks the host step by step",
                )
            )
        return
    past = history.parse_history(transport.read_bytes(path).decode("utf-8", "replace"))
    if past.unreadable_lines:
        status.notes.append(f"{past.unreadable_lines} unreadable line(s) in {path}")
    status.deploys = len(past.records)
    if not past.records:
        return
    last = past.records[-1]
    status.last_deploy = LastDeploy(
        id=last.id,
        time=last.time,
        user=last.user,
        kind=last.kind,
        outcome=last.outcome,
        rolls_back=last.rolls_back,
        files=[f.path for f in last.files],
    )
    deployed: dict[str, tuple[str, str | None]] = {}  # path -> (deploy id, sha256)
    for record in past.records:  # oldest first: the last deploy of a path wins
        for f in record.files:
            deployed[f.path] = (record.id, f.new_sha256)
    if not deployed:
        return
    live, _ = transport.hash_files(host.root, [glob_escape(p) for p in deployed])
    live_sha = {f.path: f.sha256 for f in live}
    status.live = [
        LiveFile(path, deploy_id, sha, live_sha.get(path))
        for path, (deploy_id, sha) in sorted(deployed.items())
    ]


def _service(transport: Transport, host: HostConfig, status: HostStatus) -> None:
    if host.service is None or not host.service.health:
        return
    healthy, seen = check_health(transport, host.service.health, HEALTH_TIMEOUT)
    status.service = ServiceStatus(host.service.health, healthy, seen)


def _gpus(transport: Transport, status: HostStatus) -> None:
    status.gpus = gpus_core.query_gpus(transport)


def _problem(err: KerneldevError) -> Problem:
    return Problem(type(err).__name__, err.message, err.hint)
