"""Whether a local process is stopped (SIGSTOP, `kill -STOP`, a debugger). A local server of
kerneldev's (a kept session's holder, the warm process) that is stopped answers nothing until
it is continued, so its clients pass it by instead of waiting for it. Read from Linux's
/proc (where the servers' SO_PEERCRED also comes from); elsewhere none is known stopped."""

from __future__ import annotations


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal or a tracer (/proc/PID/stat's T or t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # the state follows the command name, which may itself hold ") "
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in (b"T", b"t")
