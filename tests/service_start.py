"""Starting a sandbox's service the way `kerneldev restart` does: the restart command, then
health polls until healthy or the service's timeout."""

from __future__ import annotations

import time

from kerneldev.config import HostConfig
from kerneldev.hosts.transport.base import Transport
from kerneldev.service import restart as service


def restart_until_healthy(
    transport: Transport, host: HostConfig, pause: float
) -> tuple[bool, list[str]]:
    """(whether it became healthy within its timeout, each poll's last-check text in order),
    polling every `pause` seconds."""
    seen = []
    transport.run(host.service.restart)
    deadline = time.monotonic() + host.service.timeout
    while time.monotonic() < deadline:
        ok, last = service.check_health(transport, host.service.health, 5)
        seen.append(last)
        if ok:
            return True, seen
        time.sleep(pause)
    return False, seen
