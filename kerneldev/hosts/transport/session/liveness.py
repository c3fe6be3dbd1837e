"""Whether the host still answers a kept session's connection.

paramiko's keepalive only sends packets: it never notices a peer that stopped answering (a
stalled link, a suspended server process, a laptop's VPN gone), so every command through the
session would wait on its channel for good. The holder therefore asks the host for a reply, an
SSH `keepalive@openssh.com` global request, every `interval` seconds, and counts the connection
as gone when one has had no reply for three intervals: the bound OpenSSH gives the one-shot
commands (`ServerAliveInterval=15`, its default `ServerAliveCountMax` 3). Any reply counts,
the refusal sshd sends for a request it does not know included. Only the holder imports this.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 15.0  # seconds between keepalive requests
MISSED = 3  # intervals without a reply before the connection counts as gone
# Tests shorten the interval (the holder inherits the command's environment).
INTERVAL_ENV = "KERNELDEV_SESSION_KEEPALIVE"


def interval_from_env() -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, INTERVAL))
    except ValueError:
        return INTERVAL
    return value if value > 0 else INTERVAL


class Liveness:
    """`check()` from the holder's regular look: it sends a request when one is due (in a
    thread: paramiko waits for the reply without a timeout) and says how long the host has not
    answered once that passed `MISSED` intervals. `transport_of()` is the connection's current
    paramiko transport (a reconnect replaces it; a reply on the old one is no answer)."""

    def __init__(
        self,
        transport_of: Callable[[], Any],
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport_of = transport_of
        self.interval = interval if interval is not None else interval_from_env()
        self.clock = clock
        self._lock = threading.Lock()
        self._asked: float | None = None  # when the request waiting for its reply went out
        self._answered = clock()

    def check(self) -> float | None:
        """Seconds without an answer once they reach `MISSED` intervals, else None."""
        now = self.clock()
        with self._lock:
            if self._asked is None:
                if now - self._answered >= self.interval:
                    self._asked = now
                    threading.Thread(target=self._ask, daemon=True).start()
                return None
            silent = now - self._asked
        return silent if silent >= MISSED * self.interval else None

    def _ask(self) -> None:
        transport = self.transport_of()
        if transport is None:  # not connected (yet): nothing to judge
            with self._lock:
                self._asked, self._answered = None, self.clock()
            return
        answered = False
        try:
            # Returns on a reply, or at once when the transport is closed.
            transport.global_request("keepalive@openssh.com", wait=True)
            answered = transport.is_active()
        except Exception:  # noqa: BLE001, S110 - no answer (a rekey that timed out): below
            pass
        with self._lock:
            if answered or transport is not self.transport_of():
                self._asked = None  # answered, or asked on a connection since replaced
                self._answered = self.clock()
