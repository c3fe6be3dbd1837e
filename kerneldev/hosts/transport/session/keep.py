"""Whether a command keeps a session: the rule alone, so that a one-shot command's early ssh
(cli/early_dial.py) can ask it before the session client and the CLI are imported."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

from kerneldev.config import HostConfig

NO_KEEP_ENV = "KERNELDEV_NO_KEEP"
TRANSFER_ENV = "KERNELDEV_TRANSFER"  # ssh.TRANSFER_ENV (ssh.py loads paramiko)


# `keeping(False)` (a command's --no-keep) for the code it runs, its worker threads included
# (they run in copies of its context).
_KEEP: contextvars.ContextVar[bool | None] = contextvars.ContextVar("kerneldev_keep", default=None)


@contextlib.contextmanager
def keeping(on: bool) -> Iterator[None]:
    token = _KEEP.set(on)
    try:
        yield
    finally:
        _KEEP.reset(token)


def keep_wanted(host: HostConfig, keep: bool | None = None) -> bool:
    """Whether a command to `host` goes through a kept session: not with `keep=False` or
    inside `keeping(False)` (`--no-keep`), not with $KERNELDEV_NO_KEEP set (other than 0), not
    when the config says `session: {keep: false}`, and only for SSH hosts."""
    if keep is False or _KEEP.get() is False or host.transport != "ssh":
        return False
    if os.environ.get(NO_KEEP_ENV, "").strip() not in ("", "0"):
        return False
    if os.environ.get(TRANSFER_ENV, "").strip().lower() in ("stream", "sftp"):
        return False  # the steps are pinned to paths without the agent
    return host.session.keep
