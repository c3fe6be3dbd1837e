"""$KERNELDEV_TRANSFER, read without paramiko (the one-shot switch in `one_shot` reads it too).

By default ("auto") every step after the login goes through one host agent
(`hostside/agent.py`, started on the connection's one exec channel: no later login shell, no
later channel, no SFTP), and a host with no python3 falls back to paramiko's paths without it.
$KERNELDEV_TRANSFER pins the choice: "agent" (required: an error when it cannot start), or
"stream" or "sftp" for every transfer without the agent (paramiko's only); "auto" times the
host (ssh.py) when the agent cannot run. Timings vary with load, so tests that count remote
commands pin it; it also helps to rule one path out when debugging a host."""

from __future__ import annotations

import os

from kerneldev.errors import UsageError

TRANSFER_ENV = "KERNELDEV_TRANSFER"
TRANSFER_MODES = ("auto", "agent", "stream", "sftp")


def transfer_mode() -> str:
    """$KERNELDEV_TRANSFER: how files move ("auto", "agent", "stream" or "sftp"; unset means
    "auto"); `UsageError` for any other value."""
    mode = os.environ.get(TRANSFER_ENV, "").strip().lower() or "auto"
    if mode not in TRANSFER_MODES:
        raise UsageError(
            f"${TRANSFER_ENV} is {mode!r}, not one of {', '.join(TRANSFER_MODES)}",
            hint=f"unset {TRANSFER_ENV} to let kerneldev choose per host",
        )
    return mode
