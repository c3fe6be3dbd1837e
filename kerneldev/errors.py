"""Errors a user can act on, and the exit codes they map to.

Every expected failure raises a `KerneldevError` subclass carrying a one-line `message` and an
optional `hint` (what to do next). The CLI's single handler (`kerneldev.cli.main.main`) prints
them and returns `exit_code`; anything else is a bug and keeps its traceback. Every error class
of the project lives here; the modules that raise them re-export the ones they used to define.

This module imports nothing else of kerneldev (an import-linter contract in .importlinter):
what an error carries from elsewhere is typed by the Protocols below.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol


class HostKeyCheckLike(Protocol):
    """What `HostKeyError.check` is: a `kerneldev.hosts.hostkeys.HostKeyCheck`."""

    name: str  # the known_hosts name: `host` or `[host]:port`
    key_type: str
    fingerprint: str
    status: str


class ServiceHealthLike(Protocol):
    """What `UnhealthyError.health` is: a `kerneldev.service.restart.ServiceHealth`."""

    healthy: bool
    elapsed: float


class LockHolderLike(Protocol):
    """What `LockBusyError.holder` is: a `kerneldev.loop.lock.LockHolder`."""

    def describe(self) -> str: ...


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1  # the operation ran and found a problem (drift, refused push, unhealthy service)
    USAGE = 2  # bad command line or bad config
    UNREACHABLE = 3  # could not reach or authenticate the host (connection, host key)
    INTERRUPTED = 130  # SIGINT (Ctrl-C): 128 + 2
    TERMINATED = 143  # SIGTERM: 128 + 15


@dataclass(frozen=True)
class DeployTally:
    """Where a deploy that did not run to its end stands: the files that landed and those that
    did not. Carried by the error (`KerneldevError.tally`) so callers decide on data; the
    `Deployed: ... / Not deployed: ...` lines of its message are built from it by
    `deploy_tally.summary`."""

    deployed: tuple[str, ...] = ()
    not_deployed: tuple[str, ...] | None = ()  # None: stopped before the upload (everything)
    deploy_id: str | None = None  # named after the deployed files (watch's line has no other)
    # The connection was lost before the host reported on `not_deployed`: the host may have
    # renamed some of them (each holds its old or its new bytes), so they are not confirmed
    # rather than not deployed.
    unconfirmed: bool = False


class KerneldevError(Exception):
    """`report`: the partial result a `--json` caller still gets on stdout (a refused plan, an
    unhealthy health result), or None. `tally`: set once the message says what was deployed
    and what was not (a deploy stopped midway, or before or after its uploads)."""

    exit_code: ExitCode = ExitCode.FAILURE
    tally: DeployTally | None = None

    def __init__(self, message: str, hint: str | None = None, *, report: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.report = report

    def __str__(self) -> str:
        return self.message


class UsageError(KerneldevError):
    """The command line asked for something that cannot be done as asked."""

    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    """hosts.yaml is missing, unreadable or invalid. The message names file, key path and line."""


def on_jump_host(message: str, jump_host: str | None) -> str:
    """A connection error's message, led by the ProxyJump hop it happened on (if any)."""
    return f"jump host {jump_host}: {message}" if jump_host else message


class FileSetError(UsageError):
    """A `files` entry matches no file anywhere (a typo in the config, or a wrong `root`)."""


class HostConnectionError(KerneldevError):
    """Could not reach or log in to the host (DNS, refused, timeout, auth). `jump_host` names the
    ProxyJump hop where it failed (None: the host itself); the message starts with it."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(
        self, message: str, hint: str | None = None, *, jump_host: str | None = None
    ) -> None:
        super().__init__(on_jump_host(message, jump_host), hint)
        self.jump_host = jump_host


class HostKeyError(KerneldevError):
    """The host key is unknown or differs from the recorded one. Never bypassed silently.

    `check` is the comparison that was refused (None when known_hosts itself could not be read),
    so `kerneldev trust` can offer the key; `check.name` says whose key it is (the host's, or a
    ProxyJump hop's on the way)."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(
        self, message: str, hint: str | None = None, *, check: HostKeyCheckLike | None = None
    ) -> None:
        super().__init__(message, hint)
        self.check = check


class RemoteCommandError(KerneldevError):
    """A command on the host exited non-zero where success was required."""

    def __init__(self, message: str, result: object = None, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.result = result


class TransferError(KerneldevError):
    """Reading or writing a file on the host failed."""


class PartialDeployError(TransferError):
    """An upload failed after others had landed; the record lists what was deployed."""

    def __init__(self, message: str, deployed: list[str], not_deployed: list[str], hint: str):
        super().__init__(
            message, hint, report={"deployed": list(deployed), "not_deployed": list(not_deployed)}
        )
        self.deployed = deployed
        self.not_deployed = not_deployed


class RefusedError(KerneldevError):
    """A safety check refused the operation (unpushed edits, drift, conflict); --force overrides.
    `report` holds the refused plan when there is one."""


class NothingToRollBackError(KerneldevError):
    """`rollback` found no deploy (or an empty one) to undo."""


class StateError(KerneldevError):
    """The workspace's state file is unreadable or corrupt."""


class ServiceError(KerneldevError):
    """Restart failed or health never came."""


class UnhealthyError(ServiceError):
    """Health never came after a restart; `logs` holds the output of `service.logs`, `health`
    (also the `report`) the failed health result."""

    def __init__(
        self,
        message: str,
        logs: str | None,
        hint: str | None = None,
        health: ServiceHealthLike | None = None,
    ) -> None:
        super().__init__(message, hint, report=health)
        self.logs = logs
        self.health = health


class RestartFailedError(UnhealthyError):
    """The restart command itself failed (exited non-zero or timed out). The service cannot be
    counted on after that, so every caller that rolls back an unhealthy deploy (push --restart,
    group pushes, watch) rolls this one back too."""


class BenchError(KerneldevError):
    """The benchmark harness failed or produced unusable results."""


class ConnectionLostError(HostConnectionError):
    """The connection to the host dropped in the middle of an operation (retrying the same
    connection is pointless; polling loops should stop)."""


class SandboxError(KerneldevError):
    """The sandbox folder is not a sandbox, or its sshd or service could not be started."""


class Interrupted(KerneldevError):
    """The command was stopped by SIGINT (exit 130) or SIGTERM (exit 143) at a safe point."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        super().__init__(message or f"interrupted by {name}")
        self.signum = signum
        self.exit_code = ExitCode.TERMINATED if signum == signal.SIGTERM else ExitCode.INTERRUPTED


class LiveChangedError(TransferError):
    """`put_files`' compare-and-swap found the live file changed; `index` names the item."""

    def __init__(self, index: int, path: str) -> None:
        super().__init__(f"{path} changed on the host")
        self.index = index


class RestartSkippedError(ServiceError):
    """A second Ctrl-C skipped the restart on the original settings."""

    exit_code = ExitCode.INTERRUPTED


class LockBusyError(RefusedError):
    """Another command holds the host's lock."""

    def __init__(self, message: str, holder: LockHolderLike | None, hint: str | None = None):
        super().__init__(message, hint)
        self.holder = holder


class LockLostError(RefusedError):
    """The host's lock was taken over (a stale lock, `--break-lock`) while this command still
    ran: the host refused its next step, so nothing more of it changed the host."""


class ImportRefusedError(RefusedError):
    """The new files lack names that the live tree imports (or do not parse). `report` is the
    push/rollback result (with its import_check), which `--json` prints."""


class ImportFailedError(KerneldevError):
    """A pushed module failed to import on the host; the push was rolled back. `report` is the
    push/rollback result (with its import_check), which `--json` prints."""


class GroupError(KerneldevError):
    """A group command where at least one host did not end ok; `exit_code` is the worst
    host's, `report` the whole group's result (one entry per host)."""

    def __init__(self, message: str, exit_code: int, hint: str | None = None, *, report=None):
        super().__init__(message, hint, report=report)
        try:
            self.exit_code = ExitCode(exit_code)
        except ValueError:
            self.exit_code = ExitCode.FAILURE


class DiffersError(KerneldevError):
    """A compared host whose live files are not the reference's (exit 1, the comparison is the
    `report`)."""


class SameKernelError(RefusedError):
    """Every variant of the A/B ran the same attention kernel."""
